"""``make demo``: the main job end to end on the bundled SciFact sample, through the HTTP service.

BM25 index (Pyserini/Lucene) → a checkpoint trained briefly on the sample's train queries (cached in the
work directory) → representation store → ``aheadrank serve`` on 127.0.0.1 → the sample's test queries sent
to ``POST /v1/rerank`` (plus one ad-hoc ``POST /rerank``) → results next to BM25's, the effectiveness line
(nDCG@10 of BM25 vs the re-ranker) → clean shutdown.

    .venv/bin/python -m aheadrank.demo [--ranker tk] [--steps N] [--workdir .demo]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLE = Path(__file__).resolve().parent / "data" / "scifact-sample"
RECIPES = {  # (steps, learning rate) that fit in a few minutes on 2 CPU cores
    "tk": (60, 1e-4),
    "mores": (60, 5e-5),
    "prettr": (60, 5e-5),
    "bert": (60, 5e-5),
}


def say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def ensure_checkpoint(ranker: str, steps: int, lucene: Path, ckpt: Path) -> None:
    from aheadrank.rankers import save_checkpoint
    from aheadrank.rankers.training import TrainConfig, train
    from aheadrank.rankers.variants import default_variant
    from aheadrank.runs import build_training_data

    if (ckpt / "fingerprint.json").exists():
        print("cached")
        return
    model = default_variant(ranker).init()
    if not steps:
        save_checkpoint(model, ckpt)
        return
    data = build_training_data(SAMPLE, "train", lucene, depth=100)
    cfg = TrainConfig(
        steps=steps,
        group_size=8,
        queries_per_step=8,
        lr=RECIPES[ranker][1],
        eval_every=max(1, steps // 3),
        val_queries=20,
        seed=0,
    )
    result = train(model, data, ckpt, cfg)
    print(
        f"{result.steps} steps in {result.seconds:.0f} s; kept step {result.best_step} "
        f"(validation nDCG@10 {result.best_metric:.4f} on 20 held-out train queries)"
    )


def ensure_priors(ckpt: Path, store: Path, lucene: Path) -> None:
    """Fit the priors on the queries the trainer held out (never the test queries) and save them in the
    checkpoint (priors.json); the service then serves the combined score by default."""
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.rankers import load_config
    from aheadrank.rankers.checkpoint import read_priors_json
    from aheadrank.rerank import fit_checkpoint_priors
    from aheadrank.runs import bm25_candidates

    saved = read_priors_json(ckpt)
    if saved is None:
        queries, qrels = read_beir_split(SAMPLE, "train")
        held_out = load_config(ckpt).extra.get("train", {}).get("val_qids") or sorted(queries)[:20]
        val = {q: queries[q] for q in held_out}
        priors = fit_checkpoint_priors(
            ckpt, store, val, bm25_candidates(lucene, val, 100), qrels, {"split": "train", "held_out": True}
        )
        saved = priors.to_dict()
    w = saved["weights"]["neural+bm25+dense"]
    print(
        f"weights neural {w['neural']:.2f}, bm25 {w['bm25']:.2f}, dense {w['dense']:.2f} "
        f"(fitted on {saved['fitted_on']['queries']} held-out train queries)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranker", choices=list(RECIPES), default="tk")
    ap.add_argument(
        "--steps", type=int, default=None, help="training steps (0: untrained; default per ranker)"
    )
    ap.add_argument("--workdir", type=Path, default=Path(".demo"))
    ap.add_argument("--show", type=int, default=3, help="queries to print side by side")
    args = ap.parse_args()
    steps = RECIPES[args.ranker][0] if args.steps is None else args.steps

    import logging

    import httpx

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aheadrank.train").setLevel(logging.INFO)  # validation lines, incl. the initial weights

    from aheadrank.evaluation import evaluate, write_run
    from aheadrank.indexer.bm25 import build_bm25_index, is_lucene_index
    from aheadrank.indexer.build import BuildOptions, build_dense, build_store
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.runs import bm25_candidates
    from aheadrank.services.process import ServeProcess

    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lucene = work / "lucene"
    say(f"BM25 index of {SAMPLE.name} (Pyserini/Lucene) -> {lucene}")
    if not is_lucene_index(lucene):
        build_bm25_index(SAMPLE, lucene, progress=True)
    else:
        print("cached")

    from aheadrank.rankers.variants import default_variant

    variant = default_variant(args.ranker).name  # the registry's variant of init-ranker's defaults
    ckpt = work / f"ckpt-{variant}-{steps}"
    say(f"checkpoint {ckpt.name}: {variant} from all-MiniLM-L6-v2, {steps} training steps")
    ensure_checkpoint(args.ranker, steps, lucene, ckpt)

    store = work / f"store-{ckpt.name}"
    say(f"representation store -> {store}")
    opts = BuildOptions(str(ckpt), str(SAMPLE), str(store), shard_size=500)
    summary = build_store(opts)
    print(
        f"{summary.documents} documents, {summary.shards} shards ({summary.shards_reused} reused), "
        f"{summary.seconds:.1f} s"
    )
    say("the dense prior's field (all-MiniLM-L6-v2 as a bi-encoder, one embedding per document)")
    dense = build_dense(opts)
    print(f"{dense.documents} documents ({dense.shards_reused} shards reused), {dense.seconds:.1f} s")
    say(
        "priors: how the neural score is combined with BM25 and the dense cosine, fitted on held-out train queries"
    )
    ensure_priors(ckpt, store, lucene)

    log = work / "serve.log"
    server = ServeProcess(["--checkpoint", str(ckpt), "--store", str(store), "--index", str(lucene)], log)
    url = server.url
    say(f"starting the service on {url}")
    print(" ".join(server.args))
    try:
        try:
            ready = server.wait_ready(300)
        except (RuntimeError, TimeoutError) as exc:
            raise SystemExit(f"the service did not start: {exc}") from None
        print(f"ready in {ready:.1f} s (model loaded, store and index open, warm-up done)")
        info = httpx.get(url + "/v1/info").json()
        print(
            f"model {info['model']['name']} on {info['device']}; store {info['store']['documents']} documents"
        )

        queries, qrels = read_beir_split(SAMPLE, "test")
        say(f"POST /v1/rerank for {len(queries)} test queries (BM25 top-100 re-ranked through the store)")
        run, pure, served, latency = {}, {}, {}, []
        with httpx.Client(base_url=url, timeout=60) as client:
            for qid in sorted(queries):
                r = client.post("/v1/rerank", json={"query": queries[qid], "depth": 100})
                r.raise_for_status()
                body = r.json()
                served[qid] = body
                run[qid] = {x["docid"]: x["score"] for x in body["results"] if x["score"] is not None}
                pure[qid] = {
                    x["docid"]: x["neural_score"] for x in body["results"] if x["neural_score"] is not None
                }
                latency.append(body["timings"]["total_ms"])
            compat = client.post(
                "/rerank",
                json={
                    "query": "does smoking cause lung cancer",
                    "documents": [
                        "Cigarette smoking is the main cause of lung carcinoma.",
                        "Bananas are yellow.",
                    ],
                },
            ).json()
        cands = bm25_candidates(lucene, queries, 100)
        bm25_run = {q: dict(hits) for q, hits in cands.items()}
        write_run(work / "bm25.trec", bm25_run, "bm25")
        write_run(work / f"{ckpt.name}.trec", run, ckpt.name)
        lat = sorted(latency)
        print(
            f"latency per request: p50 {statistics.median(lat):.0f} ms, max {lat[-1]:.0f} ms "
            f"(stages of the last one: { {k: v for k, v in body['timings'].items() if v} })"
        )

        titles = {d.docid: d.text[:70] for d in Collection(SAMPLE)}
        for qid in sorted(queries)[: args.show]:
            say(f"query {qid}: {queries[qid]}")
            bm = [d for d, _ in cands[qid][:3]]
            rr = [x["docid"] for x in served[qid]["results"][:3]]
            judged = qrels[qid]

            def cell(docid: str, judged: dict = judged) -> str:
                return f"{'*' if judged.get(docid, 0) > 0 else ' '} {docid:>9} {titles[docid][:40]:<40}"

            for i in range(3):
                left = cell(bm[i]) if i < len(bm) else ""
                right = cell(rr[i]) if i < len(rr) else ""
                print(f"  {i + 1}. BM25 {left} | {args.ranker} {right}")
        say("POST /rerank (Cohere/Jina/TEI shape, ad-hoc texts): 'does smoking cause lung cancer'")
        for x in compat["results"]:
            print(f"  index {x['index']}  relevance {x['relevance_score']:.4f}")
        m_bm25 = evaluate(bm25_run, qrels, ("nDCG@10",))["nDCG@10"]
        m_rr = evaluate(run, qrels, ("nDCG@10",))["nDCG@10"]
        m_pure = evaluate(pure, qrels, ("nDCG@10",))["nDCG@10"]
        say(
            f"nDCG@10 on {len(queries)} test queries: BM25 {m_bm25:.4f} | served ({served[qid]['scoring']}) "
            f"{m_rr:.4f} | {args.ranker} alone ({steps} steps) {m_pure:.4f}   (* = judged relevant)"
        )
    finally:
        code = server.stop(60)
    say(f"service stopped (exit code {code}); {time.perf_counter() - t0:.0f} s in all; log: {log}")
    if code != 0:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
