"""Long texts sent ad hoc (the RAG path): how a text longer than the ranker's window gets its score.

A RAG app sends its chunks as texts (``POST /v2/rerank {query, documents}``); a chunk longer than the ranker's
window (128 word pieces for a label-free build) is split into passages, and its ``relevance_score`` comes from
theirs (``--passage-aggregation``). This bench loads a build in-process (the service's own ``RerankBackend``,
as ``aheadrank serve DIR`` does) and, for a judged collection's test queries, sends each query's BM25 top
``--depth`` documents as texts:

- ``stored``: the texts as the indexer read them, found in the store by their digest: scored from the stored
  passages (the docid path: the passages' neural scores aggregated, the whole text's stored dense cosine, then
  the priors; the server loaded without its index, so without the BM25 score a text gets since
  ``bench/rag_bm25.py``'s change, which the per-passage way has not: the cells compare the same features);
- ``ad-hoc``: the same texts, the store's text lookup turned off: split and encoded online, then scored the
  docid's way (the passages' neural scores aggregated, the whole text's dense cosine, then the priors): what a
  text the store does not hold gets, i.e. every RAG chunk;
- ``ad-hoc/passage``: what the service did before ``ad-hoc``: each passage's calibrated log-odds from its own
  neural score and its own dense cosine, then aggregated (computed here from the same passages' neural scores);
- ``buried`` (and ``buried/passage``): each judged-relevant candidate's text with an unrelated passage in front
  of it (the first ``--filler-words`` words of a document that is neither a candidate nor relevant; a chunk
  that starts in another section), sent ad hoc. Its rank is read against the other candidates' ``ad-hoc``
  (``ad-hoc/passage``) scores, which is exact where the build has a calibration (each text's score is its own:
  ``relevance_score`` is "calibrated"); the bench refuses otherwise.

Per cell and aggregation (``maxp``, ``first+max``, ``meanp``): nDCG@10, against ``first+max`` in the same cell
and (``ad-hoc``, ``buried``) against the per-passage way of the same aggregation (paired t-tests); the mean
``relevance_score`` (the sigmoid) of the judged-relevant texts and of the others; the Brier score of
``relevance_score`` against the judgments (the candidates only); for ``buried``: the median ``relevance_score``
of a relevant text alone and buried, and the share of relevant texts whose buried score is below half their
own. The judgments are read to evaluate only; nothing is fitted here.

    .venv/bin/python bench/rag_long_texts.py --build DIR --collection ../shared/data/scifact \\
        --out bench/results/rag-long-texts/scifact.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from benchkit import filler_docid, machine_info, sigmoid, write_record
from rich.console import Console
from rich.table import Table

AGGREGATIONS = ("maxp", "first+max", "meanp")
console = Console(width=None if sys.stdout.isatty() else 160)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, required=True, help="a directory made by `aheadrank build`")
    p.add_argument("--collection", type=Path, required=True, help="a judged BEIR collection (the build's)")
    p.add_argument("--split", default="test")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--max-queries", type=int, default=None, help="the first N queries (default: all)")
    p.add_argument("--filler-words", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--ad-hoc-windows",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the service's --ad-hoc-windows (the window prior for texts sent ad hoc; off, as served by default)",
    )
    p.add_argument("--cache-gib", type=int, default=4, help="the service's ad-hoc text cache (GiB)")
    p.add_argument("--out", type=Path, default=Path("bench/results/rag-long-texts.json"))
    return p.parse_args(argv)


class PassageScores:
    """Records the passages' neural scores ``score_texts`` aggregates (services/backend.py calls
    ``aggregate(scores, owner, n, how)`` for a request with a text longer than the window), for the per-passage
    way (:meth:`per_passage`)."""

    def __init__(self):
        self.last: tuple[list[float], list[int], int] | None = None

    def __call__(self, scores, owner, n, how="maxp"):
        from aheadrank.passages import aggregate

        self.last = (list(map(float, scores)), list(owner), n)
        return aggregate(scores, owner, n, how)

    def per_passage(self, backend, query: str, texts: list[str]) -> dict[str, list[float]]:
        """Each aggregation of the last call's texts scored the per-passage way: each passage calibrated
        with its own neural score and dense cosine, then aggregated (what ``ad-hoc`` was before)."""
        from aheadrank.passages import aggregate, flatten, split_passages

        scorer = backend.scorer
        split = split_passages(backend.ranker._text().tokenizer, texts, backend.passage_options())
        flat, owner = flatten(split)
        if self.last is None:  # no text was longer than the window: the service's one pass is the same
            raise RuntimeError("per_passage after a request without long texts")
        neural, seen, n = self.last
        self.last = None
        if seen != owner or n != len(texts):
            raise RuntimeError("the recorded passages are not this request's")
        features = {"neural": np.array(neural)}
        features["dense"] = scorer.text_dense(scorer.query_vector(query), flat).astype(np.float64)
        calibrated = scorer.calibration.logits(features).tolist()
        return {a: aggregate(calibrated, owner, n, a) for a in AGGREGATIONS}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.services import backend as backend_module
    from benchkit import served_backend

    from aheadrank.priors import ndcg10
    from aheadrank.runs import bm25_candidates

    # what `aheadrank serve DIR` serves, less its index: the per-passage way has no BM25 score, and this bench compares
    # the ways on the same features (bench/rag_bm25.py measures what BM25 adds to stored and unknown texts);
    # the cache: every passage of a query's texts, for each aggregation
    backend, built = served_backend(
        args.build,
        args.threads,
        index=None,
        text_cache_bytes=args.cache_gib << 30,
        ad_hoc_windows=args.ad_hoc_windows,
    )
    backend.warmup()
    kind = backend.score_kind()
    if kind != "calibrated":
        raise SystemExit(f"the build's relevance_score is {kind!r}, not calibrated: the buried rank needs it")
    recorder = PassageScores()
    backend_module.aggregate = recorder  # the passages' neural scores, for the per-passage way

    queries, qrels = read_beir_split(args.collection, args.split)
    queries = dict(sorted(queries.items()))
    if args.max_queries:
        queries = dict(list(queries.items())[: args.max_queries])
    cands = bm25_candidates(built["lucene"], queries, args.depth)
    wanted = {d for hits in cands.values() for d, _ in hits} | {d for q in queries for d in qrels.get(q, {})}
    texts: dict[str, str] = {}
    order: list[str] = []
    for doc in Collection(args.collection):
        order.append(doc.docid)
        if doc.docid in wanted:
            texts[doc.docid] = doc.text
    filler_text: dict[str, str] = {}

    def filler(qid: str, avoid: set[str]) -> str:
        d = filler_docid(qid, order, avoid, " (lower --depth)")
        if d not in filler_text:
            filler_text[d] = next(doc.text for doc in Collection(args.collection) if doc.docid == d)
        return " ".join(filler_text[d].split()[: args.filler_words])

    cells = ("stored", "ad-hoc", "ad-hoc/passage")
    scores: dict[str, dict[str, dict[str, dict[str, float]]]] = {
        c: {a: {} for a in AGGREGATIONS} for c in cells
    }
    buried: dict[str, dict[str, dict[tuple[str, str], float]]] = {
        c: {a: {} for a in AGGREGATIONS} for c in ("buried", "buried/passage")
    }
    served = backend.settings.passage_aggregation

    def each_way(query: str, batch: list[str]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """The texts sent ad hoc under each aggregation (the passages encoded once, then from the text
        cache), and the per-passage way's scores from the same passages' neural scores."""
        now: dict[str, list[float]] = {}
        before: dict[str, list[float]] = {}
        saved_shards, backend.reader.text_shards = backend.reader.text_shards, 0
        try:
            for a in AGGREGATIONS:
                backend.settings.passage_aggregation = a
                recorder.last = None
                now[a], _ = backend.score_texts(query, batch)
                if not before:  # texts all within the window: one passage each, the same either way
                    before = recorder.per_passage(backend, query, batch) if recorder.last else {}
                    before = before or {b: list(now[a]) for b in AGGREGATIONS}
        finally:
            backend.reader.text_shards = saved_shards
            backend.settings.passage_aggregation = served
        return now, before

    t0 = time.perf_counter()
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("queries", total=len(queries))
        for qid, query in queries.items():
            ids = [d for d, _ in cands.get(qid, []) if d in texts]
            batch = [texts[d] for d in ids]
            for a in AGGREGATIONS:  # the store's path aggregates inside its scoring loop: one pass each
                backend.settings.passage_aggregation = a
                out, _ = backend.score_texts(query, batch)
                scores["stored"][a][qid] = dict(zip(ids, out, strict=True))
            backend.settings.passage_aggregation = served
            for cell, got in zip(("ad-hoc", "ad-hoc/passage"), each_way(query, batch), strict=True):
                for a, s in got.items():
                    scores[cell][a][qid] = dict(zip(ids, s, strict=True))
            relevant = [d for d in ids if qrels.get(qid, {}).get(d, 0) > 0]  # judged relevant candidates
            if relevant:
                pad = filler(qid, set(ids) | set(relevant))
                got = each_way(query, [pad + "\n\n" + texts[d] for d in relevant])
                for cell, by_agg in zip(("buried", "buried/passage"), got, strict=True):
                    for a, s in by_agg.items():
                        buried[cell][a].update({(qid, d): v for d, v in zip(relevant, s, strict=True)})
            bar.advance(task)
            done = len(scores["ad-hoc"]["maxp"])
            if not console.is_terminal and done % 25 == 0:  # the bar is not drawn in a log
                console.print(
                    f"{done}/{len(queries)} queries, {(time.perf_counter() - t0) / done:.1f} s each"
                )
    seconds = time.perf_counter() - t0
    backend.close()

    rows = []
    against = {"buried": "ad-hoc", "buried/passage": "ad-hoc/passage"}  # the others' scores, unburied
    for cell in (*cells, *against):
        for a in AGGREGATIONS:
            per_query, rel_p, other_p, brier = {}, [], [], []
            alone, moved = [], []
            for qid in queries:
                got = dict(scores[against.get(cell, cell)][a].get(qid, {}))
                judged = qrels.get(qid, {})
                if cell in against:
                    for d in [d for d, g in judged.items() if g > 0 and (qid, d) in buried[cell][a]]:
                        alone.append(sigmoid(got[d]))  # the same text alone, ad hoc
                        got[d] = buried[cell][a][(qid, d)]
                        moved.append(sigmoid(got[d]))
                if not got:
                    continue
                ids = list(got)
                per_query[qid] = ndcg10(np.array([got[d] for d in ids]), ids, judged)
                for d, s in got.items():
                    p = sigmoid(s)
                    y = 1.0 if judged.get(d, 0) > 0 else 0.0
                    (rel_p if y else other_p).append(p)
                    brier.append((p - y) ** 2)
            row = {
                "cell": cell,
                "aggregation": a,
                "ndcg10": float(np.mean(list(per_query.values()))),
                "relevant_mean_score": statistics.fmean(rel_p) if rel_p else None,
                "other_mean_score": statistics.fmean(other_p) if other_p else None,
                "brier": statistics.fmean(brier) if brier else None,
                "per_query": per_query,
            }
            if cell in against:
                row["relevant_median_alone"] = statistics.median(alone) if alone else None
                row["relevant_median_buried"] = statistics.median(moved) if moved else None
                row["below_half_of_alone"] = (
                    sum(m < 0.5 * x for m, x in zip(moved, alone, strict=True)) / len(alone)
                    if alone
                    else None
                )
                row["relevant_texts"] = len(alone)
            rows.append(row)

    from aheadrank.evaluation import paired_test

    base = {r["cell"]: r for r in rows if r["aggregation"] == "first+max"}
    for r in rows:
        if r["aggregation"] != "first+max":
            cmp = paired_test(base[r["cell"]]["per_query"], r["per_query"])
            r["vs_first_max"] = {"diff": cmp.mean_b - cmp.mean_a, "p": cmp.p}
    by = {(r["cell"], r["aggregation"]): r for r in rows}
    for r in rows:  # the docid's way against the per-passage way, the same aggregation
        if (r["cell"] + "/passage", r["aggregation"]) in by:
            cmp = paired_test(by[(r["cell"] + "/passage", r["aggregation"])]["per_query"], r["per_query"])
            r["vs_per_passage"] = {"diff": cmp.mean_b - cmp.mean_a, "p": cmp.p}

    table = Table(
        title=f"long texts sent ad hoc: {args.collection.name} {args.split} ({len(queries)} queries)"
    )
    columns = ("cell", "aggregation", "nDCG@10", "vs first+max (p)", "vs per passage (p)")
    for col in (*columns, "rel. mean", "other mean", "Brier"):
        table.add_column(col, justify="left" if col in ("cell", "aggregation") else "right")
    table.add_column("relevant alone / buried (median)", justify="right")
    table.add_column("buried < half", justify="right")
    for r in rows:
        vs, way = r.get("vs_first_max"), r.get("vs_per_passage")
        table.add_row(
            r["cell"],
            r["aggregation"],
            f"{r['ndcg10']:.4f}",
            f"{vs['diff']:+.4f} ({vs['p']:.2g})" if vs else "",
            f"{way['diff']:+.4f} ({way['p']:.2g})" if way else "",
            f"{r['relevant_mean_score']:.3f}",
            f"{r['other_mean_score']:.3f}",
            f"{r['brier']:.4f}",
            f"{r['relevant_median_alone']:.3f} / {r['relevant_median_buried']:.3f}"
            if r["cell"] in against
            else "",
            f"{r['below_half_of_alone']:.1%}" if r["cell"] in against else "",
        )
    console.print(table)
    console.print(f"{seconds:.0f} s for {len(queries)} queries")
    write_record(
        args.out,
        "bench/rag_long_texts.py",
        argv,
        machine_info(args.threads),
        t_start,
        build=str(args.build),
        collection=str(args.collection),
        split=args.split,
        depth=args.depth,
        queries=len(queries),
        filler_words=args.filler_words,
        ad_hoc_windows=args.ad_hoc_windows,
        seconds=seconds,
        rows=rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
