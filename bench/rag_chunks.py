"""A RAG app's own chunks: what ``/rerank`` gives texts cut from the collection's documents, none of them stored.

A RAG app splits its documents into chunks and sends those (``POST /v2/rerank {query, documents}``); a chunk is not
a document of the build, so the store does not hold it: it is encoded online and gets the BM25 score it would have
as one more document of the index (``Bm25Searcher.text_scores``). ``bench/rag_bm25.py`` sends whole documents,
whose lengths are the index's own; a chunk is shorter, and BM25 normalises its length against the index's average
document. No collection judges chunks, and a chunk that inherits its document's judgment would inflate nDCG, so this
bench judges what the app would show: each document ranked by its best chunk (MaxP, as a RAG app surfaces the first
chunk of a document), against the document judgments.

This bench loads a build in-process (the service's own ``RerankBackend``, as ``aheadrank serve DIR`` does) and, for
each judged test query, cuts its BM25 top ``--depth`` documents into chunks of ``--chunk-words`` words (a last
piece shorter than half a chunk joins the one before it: a splitter that keeps no stub) and sends all of them in
one request, in the same run:

- ``chunks, with BM25`` (the served default) and ``chunks, without BM25`` (the backend's searcher set aside: what a
  server started without ``--index`` gives): ``RerankBackend.score_texts``, each document its best chunk's score;
- ``documents, with BM25``: the same documents sent whole (found in the store), for scale;
- the baselines a user would build over the same chunks: BM25 (each chunk's ``text_scores``), the bi-encoder alone
  (each chunk's cosine), RRF (k = 60) and the equal-weight z-score fusion of the two over the chunks, each document
  its best chunk's score; and the same four over the whole documents.

nDCG@10 with paired t-tests (95 % interval) against the better chunk fusion and against the chunks without BM25;
for the served cells, the mean ``relevance_score`` (the sigmoid) of the judged-relevant candidates and of the others
and its Brier score (a document's: its best chunk's), i.e. whether a threshold set on documents holds for chunks;
the seconds a request of chunks takes with and without BM25 (interleaved per query, after its chunks were encoded
once, as a repeated request reads them from the ad-hoc text cache) and a request of the whole documents, as ratios.
The judgments are read to evaluate only; nothing is fitted here.

    .venv/bin/python bench/rag_chunks.py --build DIR --collection ../shared/data/scifact \\
        --out bench/results/rag-chunks/scifact.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from benchkit import machine_info, paired, shown, sigmoid, write_record, write_table

FUSIONS = ("rrf", "fusion-equal")
CHUNKS, WITHOUT, DOCUMENTS = "chunks, with BM25", "chunks, without BM25", "documents, with BM25"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, required=True, help="a directory made by `aheadrank build`")
    p.add_argument("--collection", type=Path, required=True, help="a judged BEIR collection (the build's)")
    p.add_argument("--split", default="test")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--chunk-words", type=int, default=100, help="words per chunk (whitespace-separated)")
    p.add_argument("--max-queries", type=int, default=None, help="the first N queries by id (default: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--cache-gib", type=float, default=4.0, help="the ad-hoc text cache (chunks recur across queries)"
    )
    p.add_argument("--out", type=Path, default=Path("work/rag-chunks.json"))
    args = p.parse_args(argv)
    if args.chunk_words < 1:
        p.error("--chunk-words must be at least 1")
    return args


def chunked(text: str, words: int) -> list[str]:
    """``text`` cut into pieces of ``words`` words; a last piece shorter than half of that joins the one before."""
    if words < 1:
        raise ValueError("--chunk-words must be at least 1")
    split = text.split()
    pieces = [split[i : i + words] for i in range(0, len(split), words)] or [[]]
    if len(pieces) > 1 and 2 * len(pieces[-1]) < words:
        tail = pieces.pop()
        pieces[-1] = pieces[-1] + tail
    return [" ".join(p) for p in pieces]


def best_chunk(run: dict[str, dict[str, float]], owner: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per query, each document's score: its best chunk's (MaxP)."""
    out: dict[str, dict[str, float]] = {}
    for qid, scores in run.items():
        docs: dict[str, float] = {}
        for cid, s in scores.items():
            d = owner[cid]
            docs[d] = max(docs.get(d, -np.inf), s)
        out[qid] = docs
    return out


def scale(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]) -> dict:
    """What a client thresholding ``relevance_score`` (the sigmoid of a served score) sees: its mean over the
    judged-relevant candidates and over the others, and its Brier score against the judgments."""
    rel, other, brier = [], [], []
    for qid, scores in run.items():
        for d, s in scores.items():
            p = sigmoid(s)
            y = qrels.get(qid, {}).get(d, 0) > 0
            (rel if y else other).append(p)
            brier.append((p - y) ** 2)
    return {
        "relevant_mean": statistics.fmean(rel) if rel else None,
        "other_mean": statistics.fmean(other) if other else None,
        "brier": statistics.fmean(brier) if brier else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    from aheadrank.indexer.collections import Collection
    from aheadrank.services.texts import stored_texts
    from benchkit import eval_topics, served_backend

    from aheadrank.baselines import EQUAL_FUSION, feature_run, rrf_run
    from aheadrank.evaluation import evaluate
    from aheadrank.logs import progress_bar
    from aheadrank.priors import QueryFeatures
    from aheadrank.runs import bm25_candidates

    cache = int(args.cache_gib * (1 << 30))
    backend, built = served_backend(args.build, args.threads, text_cache_bytes=cache)
    backend.warmup()
    if backend.score_kind() != "calibrated":
        raise SystemExit(
            f"the build's relevance_score is {backend.score_kind()!r}: this bench reads a calibrated one"
        )
    if not backend.bm25_on(False):
        raise SystemExit("the build's served score does not weigh BM25: nothing for the chunks' BM25 to show")
    searcher, scorer = backend.searcher, backend.scorer
    queries, qrels = eval_topics(args.collection, args.split, args.max_queries)
    queries = {q: t for q, t in sorted(queries.items()) if any(r > 0 for r in qrels.get(q, {}).values())}
    cands = bm25_candidates(built["lucene"], queries, args.depth)
    wanted = {d for hits in cands.values() for d, _ in hits}
    texts = {doc.docid: doc.text for doc in Collection(args.collection) if doc.docid in wanted}
    pieces = {d: chunked(t, args.chunk_words) for d, t in texts.items()}
    owner = {f"{d}#{k}": d for d, ps in pieces.items() for k in range(len(ps))}

    def scored(query: str, batch: list[str], bm25: bool) -> tuple[list[float], float]:
        backend.searcher = searcher if bm25 else None
        try:
            t = time.perf_counter()
            out, _ = backend.score_texts(query, batch)
            return out, time.perf_counter() - t
        finally:
            backend.searcher = searcher

    chunk_runs: dict[str, dict[str, dict[str, float]]] = {CHUNKS: {}, WITHOUT: {}}
    doc_runs: dict[str, dict[str, dict[str, float]]] = {DOCUMENTS: {}}
    chunk_features: dict[str, QueryFeatures] = {}
    doc_features: dict[str, QueryFeatures] = {}
    seconds: dict[str, list[float]] = {CHUNKS: [], WITHOUT: [], DOCUMENTS: []}
    found = sent = 0
    first = next(iter(queries))  # warm-up: the text path's first request of each kind
    for bm25 in (True, False):
        scored(
            queries[first], [p for d, _ in cands.get(first, [])[:5] if d in texts for p in pieces[d]], bm25
        )
    for i, (qid, query) in enumerate(progress_bar(list(queries.items()), desc="queries", unit="query")):
        ids = [d for d, _ in cands.get(qid, []) if d in texts]
        if not ids:
            continue
        cids = [f"{d}#{k}" for d in ids for k in range(len(pieces[d]))]
        batch = [p for d in ids for p in pieces[d]]  # in the order of cids
        sent += len(batch)
        found += sum(d is not None for d in stored_texts(backend, batch))
        scored(query, batch, False)  # the chunks not seen before encoded online, into the cache
        for bm25 in (True, False) if i % 2 == 0 else (False, True):  # interleaved: neither always runs second
            out, sec = scored(query, batch, bm25)
            chunk_runs[CHUNKS if bm25 else WITHOUT][qid] = dict(zip(cids, out, strict=True))
            seconds[CHUNKS if bm25 else WITHOUT].append(sec)
        out, sec = scored(query, [texts[d] for d in ids], True)
        doc_runs[DOCUMENTS][qid] = dict(zip(ids, out, strict=True))
        seconds[DOCUMENTS].append(sec)
        qvec = scorer.query_vector(query)
        chunk_features[qid] = QueryFeatures(
            cids,
            {
                "bm25": np.asarray(searcher.text_scores(query, batch), dtype=np.float64),
                "dense": np.asarray(scorer.text_dense(qvec, batch), dtype=np.float64),
            },
            qrels.get(qid, {}),
        )
        bm25_of = dict(cands[qid])
        dense = scorer.stored_dense(qvec, ids)
        if dense is None:
            dense = scorer.text_dense(qvec, [texts[d] for d in ids])
        doc_features[qid] = QueryFeatures(
            ids,
            {
                "bm25": np.array([bm25_of[d] for d in ids], dtype=np.float64),
                "dense": np.asarray(dense, dtype=np.float64),
            },
            qrels.get(qid, {}),
        )
    backend.close()
    for name, features, into in (
        ("chunks", chunk_features, chunk_runs),
        ("documents", doc_features, doc_runs),
    ):
        into[f"bm25 ({name})"] = feature_run(features, {"bm25": 1.0})
        into[f"bi-encoder ({name})"] = feature_run(features, {"dense": 1.0})
        into[f"rrf ({name})"] = rrf_run(features)
        into[f"fusion-equal ({name})"] = feature_run(features, EQUAL_FUSION)
    runs = {k: best_chunk(r, owner) for k, r in chunk_runs.items()} | doc_runs
    ndcg = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    best = max((f"{f} (chunks)" for f in FUSIONS), key=ndcg.get)
    rows = {
        k: {
            "ndcg10": ndcg[k],
            "vs_best_chunk_fusion": paired(runs[best], runs[k], qrels),
            "vs_chunks_without_bm25": paired(runs[WITHOUT], runs[k], qrels),
        }
        for k in runs
    }
    for k in (CHUNKS, WITHOUT, DOCUMENTS):
        rows[k]["relevance_score"] = scale(runs[k], qrels)
    median = {k: statistics.median(v) for k, v in seconds.items() if v}
    words = [len(p.split()) for ps in pieces.values() for p in ps]
    shape = {
        "documents": len(pieces),
        "chunks": len(words),
        "chunks_per_document": len(words) / max(len(pieces), 1),
        "median_chunk_words": statistics.median(words) if words else 0,
        "texts_sent": sent,
        "found_in_store": found,
    }
    timing = {
        "median_s": median,
        "requests": len(seconds[CHUNKS]),
        "ratio_with_to_without": median[CHUNKS] / median[WITHOUT],
        "ratio_chunks_to_documents": median[CHUNKS] / median[DOCUMENTS],
    }
    lines = [
        f"{args.collection.name}, {len(chunk_features)} {args.split} queries, BM25 top {args.depth} cut into chunks "
        f"of {args.chunk_words} words: {shape['chunks_per_document']:.2f} chunks per document (median "
        f"{shape['median_chunk_words']:.0f} words), {shape['found_in_store']} of {sent} chunks sent found in the "
        f"store; each document ranked by its best chunk; better chunk fusion: {best}",
        "",
        "| run | nDCG@10 | vs better chunk fusion: diff [95 % CI], p | vs chunks without BM25: diff [95 % CI], p |",
        "|---|---:|---|---|",
    ]

    for k, r in rows.items():
        lines.append(
            f"| {k} | {r['ndcg10']:.4f} | {shown(r['vs_best_chunk_fusion'])} | {shown(r['vs_chunks_without_bm25'])} |"
        )
    lines += [
        "",
        "`relevance_score` (each document's best chunk's, or the whole document's), over the candidates:",
        "",
        "| run | mean, judged relevant | mean, the others | Brier |",
        "|---|---:|---:|---:|",
    ]
    for k in (CHUNKS, WITHOUT, DOCUMENTS):
        r = rows[k]["relevance_score"]
        lines.append(f"| {k} | {r['relevant_mean']:.3f} | {r['other_mean']:.3f} | {r['brier']:.4f} |")
    lines += [
        "",
        f"A request, median over {timing['requests']} queries (the chunks read from the ad-hoc text cache): chunks "
        f"with BM25 {median[CHUNKS] * 1e3:.0f} ms, without {median[WITHOUT] * 1e3:.0f} ms (ratio "
        f"{timing['ratio_with_to_without']:.2f}); the whole documents (found in the store) "
        f"{median[DOCUMENTS] * 1e3:.0f} ms (chunks / documents {timing['ratio_chunks_to_documents']:.2f}).",
    ]
    write_table(args.out, lines)
    write_record(
        args.out,
        "rag_chunks",
        argv,
        machine_info(args.threads),
        t_start,
        build=str(args.build),
        collection=str(args.collection),
        split=args.split,
        depth=args.depth,
        chunk_words=args.chunk_words,
        queries=len(chunk_features),
        shape=shape,
        best_chunk_fusion=best,
        rows=rows,
        timing=timing,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
