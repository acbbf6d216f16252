"""Batch jobs over a collection's queries: BM25 candidates for training, and re-ranking runs through the
precomputed path (store + query encoder + interaction), written as TREC run files."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aheadrank.evaluation import by_score
from aheadrank.passages import DEFAULT_AGGREGATION, DEFAULT_MAX_PASSAGES
from aheadrank.rerank import QUERY_PIECES, nonfinite_scores, score_stored  # noqa: F401  (the rerank core; re-exported)

log = logging.getLogger("aheadrank.runs")


def _bm25_search(index: str | Path | None) -> Callable[[dict[str, str], int], dict[str, list]]:
    """``search(queries, depth)`` over the BM25 index (the BM25 part, imported only when a search runs)."""
    from aheadrank.indexer.bm25 import bm25_candidates

    return lambda queries, depth: bm25_candidates(index, queries, depth)


def __getattr__(name: str):
    """``bm25_candidates``: the BM25 part's, re-exported here, imported on first use — importing it sets Java up,
    which re-ranking given candidates (``rerank_run``) does not need."""
    if name == "bm25_candidates":
        from aheadrank.indexer.bm25 import bm25_candidates

        return bm25_candidates
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_training_data(
    collection: str | Path,
    split: str,
    index: str | Path | None,
    depth: int = 100,
    search: Callable[[dict[str, str], int], dict[str, list]] | None = None,
):
    """TrainingData from a BEIR directory (corpus, queries, qrels/<split>.tsv) and its BM25 index, searched by
    ``search(queries, depth)`` when given (e.g. a cache of hits: {qid: [(docid, score), ...]} best first)."""
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.rankers.training import TrainingData

    queries, qrels = read_beir_split(collection, split)
    texts = {d.docid: d.text for d in Collection(collection)}
    relevant = {d for judged in qrels.values() for d, grade in judged.items() if grade > 0}
    unknown = sorted(relevant - set(texts))
    if relevant and len(unknown) == len(relevant):
        from aheadrank.errors import AheadrankError

        raise AheadrankError(
            f"none of the {len(relevant):,} documents qrels/{split}.tsv judges relevant is in the collection {collection} "
            f"(e.g. {unknown[0]!r}): the judgements of another collection?"
        )
    if unknown:
        log.warning(
            "%d of the %d documents qrels/%s.tsv judges relevant are not in the collection %s (e.g. %r): their "
            "judgements are left out of training",
            len(unknown), len(relevant), split, collection, unknown[0],
        )  # fmt: skip
    cands = (search or _bm25_search(index))(queries, depth)
    return TrainingData(texts, queries, qrels, {q: [d for d, _ in hits] for q, hits in cands.items()})


def build_pseudo_training_data(
    collection: str | Path,
    index: str | Path | None,
    kind: str = "title",
    depth: int = 100,
    max_queries: int | None = None,
    seed: int = 0,
    search: Callable[[dict[str, str], int], dict[str, list]] | None = None,
):
    """TrainingData of pseudo-queries from the collection itself (``indexer/pseudo_queries.py``): titles as
    queries for their bodies, negatives from the BM25 top-``depth`` of each title."""
    from aheadrank.errors import AheadrankError
    from aheadrank.indexer.pseudo_queries import PSEUDO_KINDS, title_queries
    from aheadrank.rankers.training import TrainingData

    if kind not in PSEUDO_KINDS:
        raise AheadrankError(f"pseudo-queries are {' or '.join(PSEUDO_KINDS)}, not {kind!r}")
    pq = title_queries(collection, max_queries=max_queries, seed=seed)
    if not pq.queries:
        raise AheadrankError(f"{collection}: no document has a title of 3 words or more to use as a query")
    cands = (search or _bm25_search(index))(pq.queries, depth)
    return TrainingData(
        pq.texts, pq.queries, pq.qrels, {q: [d for d, _ in hits] for q, hits in cands.items()}
    )


def read_first_stage(path: str | Path, depth: int) -> dict[str, list]:
    """A first-stage TREC run as {qid: [(docid, score), ...]} best first, cut at depth."""
    from aheadrank.evaluation import ranking, read_run

    run = read_run(path)
    return {q: [(d, docs[d]) for d in ranking(docs)[:depth]] for q, docs in run.items()}


@dataclass
class RerankStats:
    queries: int = 0
    candidates: int = 0
    unknown: int = 0
    seconds: dict[str, float] = field(
        default_factory=lambda: {"query": 0.0, "fetch": 0.0, "score": 0.0, "priors": 0.0}
    )
    notices: list[str] = field(default_factory=list)
    verified: dict | None = None  # store.verify.verify_before_reading's status (None: not verified)


def rerank_with_store(
    ranker,
    reader,
    query: str,
    candidates: list[tuple[str, float]],
    stats: RerankStats,
    batch: int = 256,
    scorer=None,
    pure: bool = False,
    rows_out: list | None = None,
    passages=None,
    aggregation: str = DEFAULT_AGGREGATION,
) -> list[tuple[str, float]]:
    """Re-rank candidates [(docid, first-stage score)] with stored document fields, combined with the
    priors of ``scorer`` (aheadrank/rerank.py) unless ``pure``; unknown docids keep their place below every
    re-ranked one (and are counted), never a silent zero vector. With ``passages`` (the store's, from
    ``aheadrank index --passages``), a long document is scored by its stored passages and ``aggregation``, at
    most the service's default --max-chunks-per-doc of them."""
    from aheadrank.rerank import apply_priors

    t0 = time.perf_counter()
    qs = ranker.encode_query(query)
    use_dense = scorer is not None and scorer.stored_dense_on(pure)
    qvec = scorer.query_vector(query) if use_dense else None
    stats.seconds["query"] += time.perf_counter() - t0
    docids = [d for d, _ in candidates]
    scored, unknown = score_stored(
        ranker, reader, qs, docids, stats.seconds, batch, passages, aggregation, DEFAULT_MAX_PASSAGES
    )
    bad = nonfinite_scores(scored)
    if bad:
        from aheadrank.errors import StoreError

        raise StoreError(
            f"non-finite scores for {len(bad)} document(s) {bad[:5]}: their stored values in {reader.path} are "
            "corrupt; run `aheadrank verify-store` and rebuild or restore the shards it names"
        )
    t1 = time.perf_counter()
    dense = scorer.stored_dense(qvec, [d for d, _ in scored]) if use_dense else None
    window = scorer.stored_window(qvec, [d for d, _ in scored], dense) if dense is not None else None
    stats.seconds["fetch"] += time.perf_counter() - t1
    rows = apply_priors(
        scorer, scored, dict(candidates), dense, pure=pure, seconds=stats.seconds, window=window
    )
    if rows_out is not None:  # the rows with their parts (neural, bm25, dense)
        rows_out.extend(rows)
    stats.queries += 1
    stats.candidates += len(candidates)
    stats.unknown += len(unknown)
    return [(r.docid, r.score) for r in rows] + [(d, float("-inf")) for d in unknown]


def finite_run(ranked: list[tuple[str, float]]) -> dict[str, float]:
    """TREC runs need finite scores: unknown docids (-inf) go below the re-ranked ones in first-stage order."""
    floor = min((s for _, s in ranked if s != float("-inf")), default=0.0)
    return {d: (s if s != float("-inf") else floor - 1.0 - i) for i, (d, s) in enumerate(ranked)}


def rerank_run(
    checkpoint: str | Path,
    store: str | Path,
    queries: dict[str, str],
    candidates: dict[str, list],
    device: str = "cpu",
    progress: bool = True,
    pure: bool = False,
    pure_out: dict | None = None,
    passage_aggregation: str | None = None,
    verify_store: str = "off",
) -> tuple[dict[str, dict[str, float]], RerankStats]:
    """Re-rank every query's candidates through the precomputed path, with the checkpoint's priors unless
    ``pure``; returns (run, stats). ``stats.notices`` says which priors were unavailable. ``pure_out``, when
    given, receives the pure neural run of the same pass (no second scoring). ``verify_store`` ``start``: the
    sha256 of every shard the run reads (the store, its passages and the priors' sub-stores) before the first
    query, a mismatch refusing the run (store.verify.verify_before_reading). ``passage_aggregation`` None: what
    the checkpoint's priors were fitted with (aheadrank.passages.served_aggregation), as the service reads it."""
    from aheadrank.logs import progress_bar
    from aheadrank.priors import recorded_aggregation
    from aheadrank.rankers import load_ranker
    from aheadrank.rerank import PriorScorer
    from aheadrank.store import StoreReader
    from aheadrank.store.passages import open_passages
    from aheadrank.store.verify import verify_before_reading

    passage_aggregation = recorded_aggregation(passage_aggregation, checkpoint, not pure)
    reader = StoreReader(store)
    ranker = load_ranker(checkpoint, device=device, strategy=reader.spec.strategy)
    ranker.read_queries_up_to(QUERY_PIECES)  # as the service reads them
    reader.check_fingerprint(ranker.fingerprint)
    # one query at a time: its query side (and dense prior) from CUDA graphs
    if str(device).startswith("cuda"):
        ranker.use_cuda_graphs()
    scorer = PriorScorer(ranker, store, device, use_priors=not pure, main_reader=reader)
    passages = open_passages(store, reader)  # long documents stored as passages (aheadrank index --passages)
    for notice in scorer.notices:
        log.warning(notice)
    stats = RerankStats(notices=list(scorer.notices))
    try:
        passages_reader = [passages.reader] if passages is not None else []
        stats.verified = verify_before_reading([reader, *passages_reader, *scorer.readers()], verify_store)
    except BaseException:
        for opened in (scorer, passages, reader):
            if opened is not None:
                opened.close()
        raise
    run: dict[str, dict[str, float]] = {}
    for qid in progress_bar(sorted(queries), desc="rerank", unit="q", disable=not progress):
        rows: list = []
        ranked = rerank_with_store(
            ranker,
            reader,
            queries[qid],
            candidates.get(qid, []),
            stats,
            scorer=scorer,
            pure=pure,
            rows_out=rows,
            passages=passages,
            aggregation=passage_aggregation,
        )
        run[qid] = finite_run(ranked)
        if pure_out is not None:
            neural = by_score((r.docid, r.neural) for r in rows)
            pure_out[qid] = finite_run(neural + [(d, s) for d, s in ranked if s == float("-inf")])
    scorer.close()
    if passages is not None:
        passages.close()
    reader.close()
    return run, stats


def build_label_free_training_data(
    collection: str | Path,
    index: str | Path | None,
    *,
    max_queries: int = 3000,
    depth: int = 100,
    seed: int = 0,
    search: Callable[[dict[str, str], int], dict[str, list]] | None = None,
):
    """(TrainingData, hits, the pseudo-queries) from the collection's texts alone (``indexer/pseudo_queries.py``,
    :func:`~aheadrank.indexer.pseudo_queries.label_free_queries`): each pseudo-query's BM25 top-``depth``
    are its candidates, with its source document replaced by the copy the query was cut from. ``hits``:
    the BM25 lists as searched ({qid: [(docid, score), ...]}, source docids), for the teacher."""
    from aheadrank.errors import AheadrankError
    from aheadrank.indexer.pseudo_queries import label_free_queries
    from aheadrank.rankers.training import TrainingData

    pq = label_free_queries(collection, max_queries=max_queries, seed=seed)
    if len(pq.queries) < 20:
        raise AheadrankError(
            f"{collection}: only {len(pq.queries)} documents have enough text to make training queries from (10+ "
            "words; in a collection of short texts, 3+ words that are not stopwords); a label-free ranker needs a "
            "collection of at least a few hundred such documents"
        )
    hits = (search or _bm25_search(index))(pq.queries, depth)
    cands = alias_candidates(hits, pq.qrels, pq.aliases)
    return TrainingData(pq.texts, pq.queries, pq.qrels, cands, copies=frozenset(pq.aliases)), hits, pq


def teacher_positives(data, aliases: dict[str, str]) -> list[str]:
    """Train each pseudo-query on the teacher's ranking of the *other* documents: its source (and the copy it is
    matched against) leave its candidates and teacher scores, and its one relevant document becomes the teacher's
    best remaining candidate, so that nothing is learnt from spotting the query inside its own document.
    ``data``: the label-free TrainingData with its ``teacher`` set, changed in place; queries left with fewer
    than two scored candidates (no positive and negative) are dropped. Returns the dropped qids."""
    assert data.teacher is not None, "teacher_positives needs the teacher's scores"
    dropped = []
    for q in sorted(data.queries):
        alias = next(iter(data.qrels[q]))
        gone = {alias, aliases[alias]}
        cands = [d for d in data.candidates.get(q, []) if d not in gone]
        teacher = {d: s for d, s in data.teacher.get(q, {}).items() if d not in gone}
        scored = [d for d in cands if d in teacher]
        if len(scored) < 2:  # no positive and negative left
            dropped.append(q)
            for table in (data.queries, data.qrels, data.candidates, data.teacher):
                table.pop(q, None)
            continue
        best = max(scored, key=lambda d: teacher[d])  # the first of equals in BM25 order
        data.qrels[q], data.candidates[q], data.teacher[q] = {best: 1}, cands, teacher
    return dropped


def alias_candidates(
    hits: dict[str, list], qrels: dict[str, dict[str, int]], aliases: dict[str, str]
) -> dict[str, list[str]]:
    """Each pseudo-query's BM25 docids ({qid: [(docid, score), ...]}, as searched) with its source document
    replaced by the copy the query is matched against (its one judged alias in ``qrels``)."""
    out = {}
    for q in qrels:
        alias = next(iter(qrels[q]))
        out[q] = [alias if d == aliases[alias] else d for d, _ in hits.get(q, [])]
    return out
