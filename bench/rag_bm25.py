"""The RAG path with the store's BM25: what a Cohere-style client gets for the texts a build's store holds.

A RAG app sends texts (``POST /v2/rerank {query, documents}``); the service finds those the store holds by their
digest and scores them as their docids (stored fields, then the calibration). Before, those texts were scored on
the neural score and the dense prior only: the BM25 score their documents have in the build's own index, which
``/v1/rerank`` weighs, was left out. A server with the index now gives a stored text its document's BM25 score
(``Bm25Searcher.doc_scores``: the score BM25's own candidates carry) and the calibration fitted for that feature set.

This bench loads a build in-process (the service's own ``RerankBackend``, as ``aheadrank serve DIR`` does) and sends
each judged test query's BM25 top ``--depth`` documents as texts, in the same run:

- ``texts, with BM25`` (the served default): ``RerankBackend.score_texts`` with the index;
- ``texts, without BM25``: the same backend with its searcher set aside: what the service did before, and what a
  server started without ``--index`` still does;
- ``/v1/rerank``: the docid path over the same candidates (every feature z-scored over the candidates: the score the
  label-free tables report);
- baselines over the same candidates: BM25, the bi-encoder alone, RRF (k = 60) and the equal-weight z-score fusion.

nDCG@10 with paired t-tests (95 % interval) against the better fusion and against the texts without BM25; and the
seconds a request of texts takes with and without BM25 (interleaved per query, the same texts, after a warm-up), as
a ratio, beside the time of the BM25 scores alone. The judgments are read to evaluate only; nothing is fitted here.

    .venv/bin/python bench/rag_bm25.py --build DIR --collection ../shared/data/cranfield \\
        --out bench/results/rag-bm25/cranfield.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from benchkit import machine_info, write_record

FUSIONS = ("rrf", "fusion-equal")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, required=True, help="a directory made by `aheadrank build`")
    p.add_argument("--collection", type=Path, required=True, help="a judged BEIR collection (the build's)")
    p.add_argument("--split", default="test")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--max-queries", type=int, default=None, help="the first N queries by id (default: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("work/rag-bm25.json"))
    return p.parse_args(argv)


def compared(evaluate_compare, a: dict, b: dict, qrels: dict) -> dict:
    c = evaluate_compare(a, b, qrels)
    return {"diff": c.mean_diff, "ci95": [c.ci_low, c.ci_high], "p": c.p}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    from aheadrank.indexer.collections import Collection
    from aheadrank.services.backend import StageClock
    from aheadrank.services.texts import stored_texts
    from benchkit import eval_topics, served_backend

    from aheadrank.baselines import EQUAL_FUSION, feature_run, rrf_run
    from aheadrank.evaluation import compare, evaluate
    from aheadrank.priors import QueryFeatures
    from aheadrank.runs import bm25_candidates

    backend, built = served_backend(args.build, args.threads)  # what `aheadrank serve DIR` serves
    backend.warmup()
    if backend.score_kind() != "calibrated":
        raise SystemExit(
            f"the build's relevance_score is {backend.score_kind()!r}: this bench reads a calibrated one"
        )
    searcher = backend.searcher
    queries, qrels = eval_topics(args.collection, args.split, args.max_queries)
    queries = {q: t for q, t in sorted(queries.items()) if any(r > 0 for r in qrels.get(q, {}).values())}
    cands = bm25_candidates(built["lucene"], queries, args.depth)
    wanted = {d for hits in cands.values() for d, _ in hits}
    texts = {doc.docid: doc.text for doc in Collection(args.collection) if doc.docid in wanted}

    runs: dict[str, dict[str, dict[str, float]]] = {
        k: {} for k in ("texts, with BM25", "texts, without BM25", "/v1/rerank")
    }
    features: dict[str, QueryFeatures] = {}
    seconds: dict[str, list[float]] = {"with": [], "without": [], "doc_scores": []}
    stored = 0

    def scored(query: str, batch: list[str], bm25: bool) -> tuple[list[float], float]:
        backend.searcher = searcher if bm25 else None
        try:
            t = time.perf_counter()
            out, _ = backend.score_texts(query, batch)
            return out, time.perf_counter() - t
        finally:
            backend.searcher = searcher

    first = next(iter(queries))  # warm-up: the text path's first request of each kind
    for bm25 in (True, False):
        scored(queries[first], [texts[d] for d, _ in cands.get(first, [])[:10] if d in texts], bm25)
    from aheadrank.logs import progress_bar

    for i, (qid, query) in enumerate(progress_bar(list(queries.items()), desc="queries", unit="query")):
        ids = [d for d, _ in cands.get(qid, []) if d in texts]
        if not ids:
            continue
        batch = [texts[d] for d in ids]
        stored += sum(d is not None for d in stored_texts(backend, batch))
        order = (True, False) if i % 2 == 0 else (False, True)  # interleaved: neither always runs second
        for bm25 in order:
            out, sec = scored(query, batch, bm25)
            runs["texts, with BM25" if bm25 else "texts, without BM25"][qid] = dict(
                zip(ids, out, strict=True)
            )
            seconds["with" if bm25 else "without"].append(sec)
        t = time.perf_counter()  # the BM25 scores alone, as the texts with BM25 ask for them
        searcher.doc_scores(query, ids)
        seconds["doc_scores"].append(time.perf_counter() - t)
        outcome = backend.rerank(query, None, args.depth, None, time.perf_counter(), StageClock())
        runs["/v1/rerank"][qid] = {d: s for d, s, _ in outcome.ranked if s is not None}
        bm25_of = dict(cands[qid])
        docs = [d for d in ids if d in outcome.parts]
        features[qid] = QueryFeatures(
            docs,
            {
                "bm25": np.array([bm25_of[d] for d in docs], dtype=np.float64),
                "dense": np.array([outcome.parts[d][1] for d in docs], dtype=np.float64),
            },
            qrels.get(qid, {}),
        )
    backend.close()
    runs["bm25"] = feature_run(features, {"bm25": 1.0})
    runs["bi-encoder"] = feature_run(features, {"dense": 1.0})
    runs["rrf"] = rrf_run(features)
    runs["fusion-equal"] = feature_run(features, EQUAL_FUSION)
    ndcg = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    best = max(FUSIONS, key=ndcg.get)
    rows = {
        k: {
            "ndcg10": ndcg[k],
            "vs_best_fusion": compared(compare, runs[best], runs[k], qrels),
            "vs_texts_without_bm25": compared(compare, runs["texts, without BM25"], runs[k], qrels),
        }
        for k in runs
    }
    with_s, without_s = statistics.median(seconds["with"]), statistics.median(seconds["without"])
    timing = {
        "median_s_with_bm25": with_s,
        "median_s_without_bm25": without_s,
        "ratio": with_s / without_s,
        "requests": len(seconds["with"]),
        "median_s_doc_scores": statistics.median(seconds["doc_scores"]),
    }
    lines = [
        f"{args.collection.name}, {len(features)} {args.split} queries, BM25 top {args.depth} sent as texts "
        f"({stored} of {sum(len(f.docids) for f in features.values())} found in the store); better fusion: {best}",
        "",
        "| run | nDCG@10 | vs better fusion: diff [95 % CI], p | vs texts without BM25: diff [95 % CI], p |",
        "|---|---:|---|---|",
    ]

    def shown(c: dict) -> str:
        return f"{c['diff']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}], p {c['p']:.2g}"

    for k, r in rows.items():
        lines.append(
            f"| {k} | {r['ndcg10']:.4f} | {shown(r['vs_best_fusion'])} | {shown(r['vs_texts_without_bm25'])} |"
        )
    lines += [
        "",
        f"A request of {args.depth} texts, median over {timing['requests']} queries: {with_s * 1e3:.0f} ms with BM25, "
        f"{without_s * 1e3:.0f} ms without (ratio {timing['ratio']:.2f}); the BM25 scores of its documents alone "
        f"(`Bm25Searcher.doc_scores`) {timing['median_s_doc_scores'] * 1e3:.1f} ms.",
    ]
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    write_record(
        args.out,
        "rag_bm25",
        argv,
        machine_info(args.threads),
        t_start,
        build=str(args.build),
        collection=str(args.collection),
        split=args.split,
        depth=args.depth,
        queries=len(features),
        stored_texts=stored,
        best_fusion=best,
        rows=rows,
        timing=timing,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
