"""``make demo``: the main job end to end on the bundled SciFact sample.

BM25 index (Pyserini) → a checkpoint (trained briefly on the sample's train queries, cached in the work
directory) → representation store → re-ranking of the test queries through the stored representations →
results next to BM25's and the effectiveness line (nDCG@10 of BM25 vs the re-ranker).

    .venv/bin/python -m aheadrank.demo [--ranker tk] [--steps 150] [--workdir .demo]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SAMPLE = Path(__file__).resolve().parent / "data" / "scifact-sample"
OPTIONS = {"tk": {"tk_layers": 2}, "mores": {"ibs": 1}, "prettr": {"layer": 5, "compress": 128}, "bert": {}}
LEARNING_RATES = {"tk": 1e-3, "mores": 3e-5, "prettr": 3e-5, "bert": 3e-5}


def say(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranker", choices=list(OPTIONS), default="tk")
    ap.add_argument("--steps", type=int, default=0, help="training steps (0: the untrained initialisation)")
    ap.add_argument("--workdir", type=Path, default=Path(".demo"))
    ap.add_argument("--show", type=int, default=3, help="queries to print side by side")
    args = ap.parse_args()

    from aheadrank.evaluation import evaluate, write_run
    from aheadrank.runs import bm25_candidates, build_training_data, rerank_run
    from indexer.bm25 import build_bm25_index, is_lucene_index
    from indexer.build import BuildOptions, build_store
    from indexer.topics import read_beir_split
    from rankers import init_ranker, save_checkpoint
    from rankers.training import TrainConfig, train

    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lucene = work / "lucene"
    say(f"BM25 index of {SAMPLE.name} (Pyserini/Lucene) -> {lucene}")
    if not is_lucene_index(lucene):
        build_bm25_index(SAMPLE, lucene, progress=True)
    else:
        print("cached")

    ckpt = work / f"ckpt-{args.ranker}-{args.steps}"
    say(f"checkpoint {ckpt.name}: {args.ranker} from all-MiniLM-L6-v2, {args.steps} training steps")
    if not (ckpt / "fingerprint.json").exists():
        model = init_ranker(args.ranker, **OPTIONS[args.ranker])
        if args.steps:
            data = build_training_data(SAMPLE, "train", lucene, depth=100)
            cfg = TrainConfig(
                steps=args.steps,
                group_size=8,
                queries_per_step=8,
                lr=LEARNING_RATES[args.ranker],
                eval_every=max(1, args.steps // 3),
                val_queries=20,
                seed=0,
            )
            train(model, data, ckpt, cfg)
        else:
            save_checkpoint(model, ckpt)
    else:
        print("cached")

    store = work / f"store-{ckpt.name}"
    say(f"representation store -> {store}")
    summary = build_store(BuildOptions(str(ckpt), str(SAMPLE), str(store), shard_size=500))
    print(
        f"{summary.documents} documents, {summary.shards} shards ({summary.shards_reused} reused), "
        f"{summary.seconds:.1f} s"
    )

    queries, qrels = read_beir_split(SAMPLE, "test")
    say(f"re-ranking BM25 top-100 of {len(queries)} test queries through the stored representations")
    cands = bm25_candidates(lucene, queries, 100)
    run, stats = rerank_run(ckpt, store, queries, cands, progress=True)
    bm25_run = {q: dict(hits) for q, hits in cands.items()}
    write_run(work / "bm25.trec", bm25_run, "bm25")
    write_run(work / f"{ckpt.name}.trec", run, ckpt.name)
    per_q = 1000 * sum(stats.seconds.values()) / max(1, stats.queries)
    print(
        f"{stats.candidates} candidates, {per_q:.0f} ms per query (query {stats.seconds['query']:.1f} s, "
        f"fetch {stats.seconds['fetch']:.1f} s, score {stats.seconds['score']:.1f} s), "
        f"{stats.unknown} unknown docids"
    )

    from indexer.collections import Collection

    titles = {d.docid: d.text[:70] for d in Collection(SAMPLE)}
    for qid in sorted(queries)[: args.show]:
        say(f"query {qid}: {queries[qid]}")
        bm = [d for d, _ in cands[qid][:3]]
        rr = sorted(run[qid], key=run[qid].get, reverse=True)[:3]
        judged = qrels[qid]
        for i in range(3):
            left = f"{'*' if judged.get(bm[i], 0) > 0 else ' '} {bm[i]:>9} {titles[bm[i]][:40]:<40}" if i < len(bm) else ""
            right = f"{'*' if judged.get(rr[i], 0) > 0 else ' '} {rr[i]:>9} {titles[rr[i]][:40]}" if i < len(rr) else ""
            print(f"  {i + 1}. BM25 {left} | {args.ranker} {right}")
    m_bm25 = evaluate(bm25_run, qrels, ("nDCG@10",))["nDCG@10"]
    m_rr = evaluate(run, qrels, ("nDCG@10",))["nDCG@10"]
    say(
        f"nDCG@10 on {len(queries)} test queries: BM25 {m_bm25:.4f} | {args.ranker} ({args.steps} steps) {m_rr:.4f}"
        f"   (* = judged relevant; {time.perf_counter() - t0:.0f} s in all)"
    )


if __name__ == "__main__":
    main()
