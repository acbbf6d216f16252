"""The RAG path with BM25: what a Cohere-style client gets for its texts, found in the build's store or not.

A RAG app sends texts (``POST /v2/rerank {query, documents}``); the service finds those the store holds by their
digest and scores them as their docids (stored fields, then the calibration), and encodes the others online. Before,
texts were scored on the neural score and the dense prior only: BM25, which ``/v1/rerank`` weighs, was left out. A
server with the index now gives a text the store holds its document's BM25 score (``Bm25Searcher.doc_scores``: the
score BM25's own candidates carry) and any other text the score it would have as one more document of the index
(``Bm25Searcher.text_scores``: the index's statistics), with the calibration fitted for that feature set.

This bench loads a build in-process (the service's own ``RerankBackend``, as ``aheadrank serve DIR`` does) and sends
each judged test query's BM25 top ``--depth`` documents as texts, in the same run:

- ``texts, with BM25`` (the served default): ``RerankBackend.score_texts`` with the index, the texts found in the
  store;
- ``texts, without BM25``: the same backend with its searcher set aside: what the service did before, and what a
  server started without ``--index`` still does;
- ``unknown texts, with BM25`` and ``unknown texts, without BM25``: the same texts with the store's text lookup
  turned off, as a RAG app's own chunks are: encoded online (once: the second cell reads the ad-hoc text cache);
- ``/v1/rerank``: the docid path over the same candidates (every feature z-scored over the candidates: the score the
  label-free tables report);
- baselines over the same candidates: BM25, the bi-encoder alone, RRF (k = 60) and the equal-weight z-score fusion.

nDCG@10 with paired t-tests (95 % interval) against the better fusion and against the texts without BM25; and the
seconds a request of texts takes with and without BM25 (interleaved per query, the same texts, after a warm-up; the
unknown texts timed once the cache holds them), as ratios, beside the time of the BM25 scores alone. The judgments
are read to evaluate only; nothing is fitted here.

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
from benchkit import machine_info, paired, shown, write_record, write_table

FUSIONS = ("rrf", "fusion-equal")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, required=True, help="a directory made by `aheadrank build`")
    p.add_argument("--collection", type=Path, required=True, help="a judged BEIR collection (the build's)")
    p.add_argument("--split", default="test")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--max-queries", type=int, default=None, help="the first N queries by id (default: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--unknown",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the unknown-text cells too (encoded online: the longest part of the run)",
    )
    p.add_argument("--out", type=Path, default=Path("work/rag-bm25.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    from aheadrank.indexer.collections import Collection
    from aheadrank.services.backend import StageClock
    from aheadrank.services.texts import stored_texts
    from benchkit import eval_topics, served_backend

    from aheadrank.baselines import EQUAL_FUSION, feature_run, rrf_run
    from aheadrank.evaluation import evaluate
    from aheadrank.priors import QueryFeatures
    from aheadrank.runs import bm25_candidates

    # what `aheadrank serve DIR` serves, with an ad-hoc text cache that holds a request's texts for its second cell
    backend, built = served_backend(args.build, args.threads, text_cache_bytes=1 << 30)
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

    cells = {
        (found, bm25): f"{'' if found else 'unknown '}texts, with{'' if bm25 else 'out'} BM25"
        for found in ((True, False) if args.unknown else (True,))
        for bm25 in (True, False)
    }
    runs: dict[str, dict[str, dict[str, float]]] = {k: {} for k in [*cells.values(), "/v1/rerank"]}
    features: dict[str, QueryFeatures] = {}
    seconds: dict[str, list[float]] = {k: [] for k in [*cells.values(), "doc_scores", "text_scores"]}
    stored = 0
    shards = backend.reader.text_shards

    def scored(query: str, batch: list[str], found: bool, bm25: bool) -> tuple[list[float], float]:
        backend.searcher = searcher if bm25 else None
        backend.reader.text_shards = shards if found else 0  # 0: no text is looked up in the store
        try:
            t = time.perf_counter()
            out, _ = backend.score_texts(query, batch)
            return out, time.perf_counter() - t
        finally:
            backend.searcher, backend.reader.text_shards = searcher, shards

    first = next(iter(queries))  # warm-up: the text path's first request of each kind
    for found, bm25 in cells:
        scored(queries[first], [texts[d] for d, _ in cands.get(first, [])[:10] if d in texts], found, bm25)
    from aheadrank.logs import progress_bar

    for i, (qid, query) in enumerate(progress_bar(list(queries.items()), desc="queries", unit="query")):
        ids = [d for d, _ in cands.get(qid, []) if d in texts]
        if not ids:
            continue
        batch = [texts[d] for d in ids]
        stored += sum(d is not None for d in stored_texts(backend, batch))
        if args.unknown:  # encoded online once, into the cache the timed requests read
            scored(query, batch, False, False)
        for found in (True, False) if args.unknown else (True,):
            order = (True, False) if i % 2 == 0 else (False, True)  # interleaved: neither always runs second
            for bm25 in order:
                out, sec = scored(query, batch, found, bm25)
                runs[cells[found, bm25]][qid] = dict(zip(ids, out, strict=True))
                seconds[cells[found, bm25]].append(sec)
        t = time.perf_counter()  # the BM25 scores alone, as the texts with BM25 ask for them
        searcher.doc_scores(query, ids)
        seconds["doc_scores"].append(time.perf_counter() - t)
        t = time.perf_counter()
        searcher.text_scores(query, batch)
        seconds["text_scores"].append(time.perf_counter() - t)
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
    without = {cells[found, True]: cells[found, False] for found, _ in cells}
    rows = {
        k: {
            "ndcg10": ndcg[k],
            "vs_best_fusion": paired(runs[best], runs[k], qrels),
            # a cell with BM25 against the same texts without it; any other run against the found texts without it
            "vs_without_bm25": paired(runs[without.get(k, cells[True, False])], runs[k], qrels),
        }
        for k in runs
    }
    median = {k: statistics.median(v) for k, v in seconds.items() if v}
    timing = {
        "median_s": median,
        "requests": len(seconds["doc_scores"]),
        "ratio_with_to_without": {
            kind: median[cells[found, True]] / median[cells[found, False]]
            for found, kind in ((True, "found"), (False, "unknown"))
            if (found, True) in cells
        },
    }
    lines = [
        f"{args.collection.name}, {len(features)} {args.split} queries, BM25 top {args.depth} sent as texts "
        f"({stored} of {sum(len(f.docids) for f in features.values())} found in the store); better fusion: {best}",
        "",
        "| run | nDCG@10 | vs better fusion: diff [95 % CI], p | vs the same texts without BM25: diff [95 % CI], p |",
        "|---|---:|---|---|",
    ]

    for k, r in rows.items():
        lines.append(
            f"| {k} | {r['ndcg10']:.4f} | {shown(r['vs_best_fusion'])} | {shown(r['vs_without_bm25'])} |"
        )
    lines += ["", f"A request of {args.depth} texts, median over {timing['requests']} queries (ms):", ""]
    lines += ["| texts | with BM25 | without | ratio |", "|---|---:|---:|---:|"]
    for kind, ratio in timing["ratio_with_to_without"].items():
        found = kind == "found"
        lines.append(
            f"| {kind} | {median[cells[found, True]] * 1e3:.0f} | {median[cells[found, False]] * 1e3:.0f} "
            f"| {ratio:.2f} |"
        )
    lines += [
        "",
        f"The BM25 scores alone: {median['doc_scores'] * 1e3:.1f} ms by docid (`Bm25Searcher.doc_scores`), "
        f"{median['text_scores'] * 1e3:.1f} ms by text (`Bm25Searcher.text_scores`).",
    ]
    write_table(args.out, lines)
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
