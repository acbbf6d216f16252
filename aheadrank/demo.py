"""``make demo``: the README's journey end to end on the bundled SciFact sample, through the HTTP service.

``aheadrank build`` (:mod:`aheadrank.build`: collection check → BM25 index → training queries → the bi-encoder's
dense field → the ranker (the build's default, MORES 2×IB Reuse-S2, kept as the base model made it: a label-free
build does not fine-tune unless given steps) → representation store → priors; into
``WORKDIR/build-RANKER-STEPS-LABELS``, where a rerun finds every stage done) → ``aheadrank serve DIR`` on
127.0.0.1 → the sample's test queries sent to ``POST /v1/rerank`` (plus one ad-hoc ``POST /rerank``) → results
next to BM25's, the effectiveness line (nDCG@10 of BM25, the label-free BM25 + bi-encoder fusion, the served
score and the ranker alone) beside the served score's weights → clean shutdown.

The demo builds **without judgments** by default (``--labels none``): the README's first journey is "my corpus,
no judgments", so the demo shows that one, with the build's own defaults. The sample's ``qrels/train.tsv`` is
left unused: pseudo-queries cut from the sample's abstracts are held out to check the ranker (and train it, given
``--steps N``), and the served score gives the neural score its kind's label-free share
(:func:`aheadrank.build.label_free_weights`: 1/3 for MORES, 1/6 for TK and PreTTR), BM25 and the bi-encoder the
rest in equal parts. The test judgments are only read to score the result, which is then an honest held-out
measurement of a build that saw no judgment at all. ``--labels train`` shows the labelled journey instead (trains
on the sample's train queries, fits the weights on the fifth the trainer held out): with so few queries the fit
can give the ranker no weight at all (it did: neural 0.00, bm25 0.05, dense 0.95 before this demo used
``aheadrank build``).

    .venv/bin/python -m aheadrank.demo [--ranker mores-2ib-s2] [--steps N] [--labels none|train|auto] [--workdir .demo]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from aheadrank.build import DEFAULT_RANKER  # noqa: E402  (light: torch is imported by the stages, not here)

SAMPLE = Path(__file__).resolve().parent / "data" / "scifact-sample"
# the build's default ranker first; tk-2l (two small TK layers) trains in a few minutes on 2 CPU cores with
# --steps 60, where the kind ``tk`` built label-free is tk-6l-base (aheadrank.build.LABEL_FREE_VARIANTS), six
# layers over every document
RANKERS = (DEFAULT_RANKER, "tk-2l", "tk", "mores", "prettr", "bert")
# label-free: pseudo-queries cut from the sample (100 held out, enough for --steps 60 x 8 queries)
MAX_QUERIES = 600


def say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def weights_line(checkpoint: Path) -> str:
    """The served score's weights (the checkpoint's priors.json) and what they were fitted on."""
    from aheadrank.priors import read_priors

    priors = read_priors(checkpoint)
    if priors is None:
        return "no priors (the neural score alone is served)"
    w = priors.widest()
    origin = priors.fitted_on.get("label_free") or (
        f"fitted on {priors.fitted_on.get('queries', '?')} held-out {priors.fitted_on.get('split', '')} queries"
    )
    parts = " / ".join(f"{f} {w.get(f, 0):.2f}" for f in ("neural", "bm25", "dense", "window") if f in w)
    return f"weights {parts} ({origin})"


def fusion_scores(results: list[dict]) -> dict[str, float]:
    """The label-free fusion of one response's candidates: z-scored BM25 and bi-encoder scores, equal weights
    (:data:`aheadrank.baselines.EQUAL_FUSION`), what the served score adds the neural score to."""
    import numpy as np

    from aheadrank.baselines import EQUAL_FUSION
    from aheadrank.priors import zscore

    rows = [x for x in results if x["bm25_score"] is not None and x["dense_score"] is not None]
    parts = {"bm25": [x["bm25_score"] for x in rows], "dense": [x["dense_score"] for x in rows]}
    total = sum(w * zscore(np.array(parts[f])) for f, w in EQUAL_FUSION.items())
    return {x["docid"]: float(s) for x, s in zip(rows, np.atleast_1d(total), strict=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranker", choices=RANKERS, default=RANKERS[0])
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps (default: the recipe's; a label-free build does not train unless given them)",
    )
    ap.add_argument(
        "--labels",
        default="none",
        help="none: label-free (the default: pseudo-queries from the sample's texts); train: the sample's "
        "qrels/train.tsv (150 judged queries); auto: as aheadrank build (label-free here: fewer than 400 judged)",
    )
    ap.add_argument("--workdir", type=Path, default=Path(".demo"))
    ap.add_argument("--show", type=int, default=3, help="queries to print side by side")
    args = ap.parse_args()

    import logging

    import httpx

    from aheadrank.logs import cli_logging

    cli_logging()
    logging.getLogger("aheadrank.train").setLevel(logging.INFO)  # validation lines

    from aheadrank.build import BuildPlan, build, judged_split, paths
    from aheadrank.evaluation import evaluate, write_run
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.services.process import ServeProcess

    work = args.workdir.resolve()
    steps = "default" if args.steps is None else args.steps
    out = work / f"build-{args.ranker}-{steps}-{args.labels}"
    t0 = time.perf_counter()
    say(
        f"aheadrank build --collection {SAMPLE.name} --out {out} --ranker {args.ranker} "
        + ("" if args.steps is None else f"--steps {args.steps} ")
        + f"--labels {args.labels}"
    )
    plan = BuildPlan(
        str(SAMPLE),
        str(out),
        ranker=args.ranker,
        labels=args.labels,
        steps=args.steps,
        max_queries=MAX_QUERIES,
    )
    trained = build(plan).stages["train"]
    ckpt = paths(out)["checkpoint"]
    kept = f"{trained['steps']} steps, kept step {trained['best_step']}"
    held_out = "pseudo-queries" if judged_split(SAMPLE, args.labels) is None else "train queries"
    val = f"validation nDCG@10 {trained['val_ndcg10']:.4f} on held-out {held_out}"
    print(f"{trained.get('variant', args.ranker)}: {kept} ({val})")
    weights = weights_line(ckpt)
    print(weights)

    log = work / "serve.log"
    server = ServeProcess([str(out)], log)
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
        runs: dict[str, dict] = {"bm25": {}, "fusion": {}, "served": {}, "pure": {}}
        served, latency = {}, []
        with httpx.Client(base_url=url, timeout=60) as client:
            for qid in sorted(queries):
                r = client.post("/v1/rerank", json={"query": queries[qid], "depth": 100})
                r.raise_for_status()
                body = r.json()
                served[qid] = body
                res = body["results"]
                runs["served"][qid] = {x["docid"]: x["score"] for x in res if x["score"] is not None}
                runs["pure"][qid] = {
                    x["docid"]: x["neural_score"] for x in res if x["neural_score"] is not None
                }
                runs["bm25"][qid] = {x["docid"]: x["bm25_score"] for x in res if x["bm25_score"] is not None}
                runs["fusion"][qid] = fusion_scores(res)
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
        write_run(work / "bm25.trec", runs["bm25"], "bm25")
        write_run(work / f"{out.name}.trec", runs["served"], out.name)
        lat = sorted(latency)
        print(
            f"latency per request: p50 {statistics.median(lat):.0f} ms, max {lat[-1]:.0f} ms "
            f"(stages of the last one: { {k: v for k, v in body['timings'].items() if v} })"
        )

        titles = {d.docid: d.text[:70] for d in Collection(SAMPLE)}
        for qid in sorted(queries)[: args.show]:
            say(f"query {qid}: {queries[qid]}")
            bm = sorted(runs["bm25"][qid], key=runs["bm25"][qid].get, reverse=True)[:3]
            rr = [x["docid"] for x in served[qid]["results"][:3]]
            judged = qrels[qid]

            def cell(docid: str, judged: dict = judged) -> str:
                return f"{'*' if judged.get(docid, 0) > 0 else ' '} {docid:>9} {titles[docid][:40]:<40}"

            for i in range(3):
                left = cell(bm[i]) if i < len(bm) else ""
                right = cell(rr[i]) if i < len(rr) else ""
                print(f"  {i + 1}. BM25 {left} | served {right}")
        say("POST /rerank (Cohere/Jina/TEI shape, ad-hoc texts): 'does smoking cause lung cancer'")
        for x in compat["results"]:
            print(f"  index {x['index']}  relevance {x['relevance_score']:.4f}")
        m = {k: evaluate(run, qrels, ("nDCG@10",))["nDCG@10"] for k, run in runs.items()}
        say(
            f"nDCG@10 on {len(queries)} test queries: BM25 {m['bm25']:.4f} | BM25 + bi-encoder fusion "
            f"{m['fusion']:.4f} | served ({served[qid]['scoring']}) {m['served']:.4f} | {args.ranker} alone "
            f"({kept}) {m['pure']:.4f}   (* = judged relevant)\n   served score: {weights}"
        )
    finally:
        code = server.stop(60)
    say(f"service stopped (exit code {code}); {time.perf_counter() - t0:.0f} s in all; log: {log}")
    if code != 0:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
