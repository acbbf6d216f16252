"""The served score: a ranker's neural scores plus the priors (BM25, dense), combined by the fitted weights.

:class:`PriorScorer` holds what the priors need beside the ranker: the checkpoint's fitted
:class:`~aheadrank.priors.Priors`, the store's dense field (``<store>/dense``) and the dense query encoder.
:func:`apply_priors` turns one query's neural scores into ranked :class:`Scored` rows; ``rerank-run``, the
service and the benchmarks all call it, so every path serves the same scores in the same order (ties by
docid descending: :func:`aheadrank.evaluation.best_first`, the order trec_eval evaluates). The rerank core
also holds the one fetch-and-score loop (:func:`score_stored`) that ``rerank-run`` and the service share.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aheadrank.errors import AheadrankError, StoreError
from aheadrank.evaluation import by_score
from aheadrank.passages import DEFAULT_AGGREGATION, DEFAULT_MAX_PASSAGES
from aheadrank.priors import Priors, subset_key

log = logging.getLogger("aheadrank.rerank")
DENSE_DIR = "dense"


@dataclass
class Scored:
    docid: str
    score: float  # the final score (the neural score itself when served pure or without priors)
    neural: float
    bm25: float | None = None
    dense: float | None = None
    window: float | None = None


# word pieces of a query read by every online path (the service, rerank-run, fitting the priors), where the ranker's
# positions allow (Ranker.read_queries_up_to): the same number everywhere, so what is fitted and measured is what is
# served (bench/results/long_inputs-queries.md: 16 -> 64 pieces, nDCG@10 0.494 -> 0.502 on SciFact)
QUERY_PIECES = 64


def dense_cosines(reader, qvec: np.ndarray, docids: list[str]) -> np.ndarray:
    """Cosines of a query vector with the documents' stored dense embeddings (``reader``: a dense store);
    a docid missing from the field or a non-finite value is a StoreError, never a silent score."""
    fetched = reader.fetch(docids)
    if fetched.unknown:
        raise StoreError(f"docids missing from the dense field {reader.path}: {fetched.unknown[:5]}")
    cos = fetched.fields["dense"][:, 0, :].astype(np.float32) @ qvec.astype(np.float32)
    if not np.all(np.isfinite(cos)):
        from aheadrank.errors import StoreDamagedError

        bad = [d for d, c in zip(docids, cos, strict=True) if not np.isfinite(c)]
        files = reader.mark_damaged(bad, f"non-finite stored values (documents {bad[:3]})")
        raise StoreDamagedError(
            f"the dense field holds corrupt (non-finite) values for {bad[:5]} in {files}: those shards are "
            "refused; run `aheadrank verify-store` on the store and rebuild it with `aheadrank index`",
            files,
        )
    return cos


def window_cosines(windows, qvec: np.ndarray, docids: list[str], dense: np.ndarray) -> np.ndarray:
    """Each document's best sentence window's cosine with the query (the ``window`` prior): the largest over its
    stored windows (``windows``: store/windows.py's sub-store, as ``StoredPassages``), and ``dense`` (its
    cosine in the dense field, in ``docids`` order) for a document that is one window. A window missing from
    ``windows/`` or a non-finite value is a StoreError (:func:`dense_cosines`), never a silent score."""
    out = np.asarray(dense, dtype=np.float32).copy()
    expanded = windows.expand(docids)
    if not expanded:
        return out
    cos = dense_cosines(windows.reader, qvec, [p for ps in expanded.values() for p in ps])
    at = {d: i for i, d in enumerate(docids)}
    start = 0
    for d, ps in expanded.items():
        out[at[d]] = cos[start : start + len(ps)].max()
        start += len(ps)
    return out


def weighs_windows(priors: Priors) -> bool:
    """Whether the priors give the window prior a weight in some feature set."""
    return any(w.get("window") for w in priors.weights.values())


def open_dense_field(store: str | Path, fingerprint: str, main_reader=None, notices: list | None = None):
    """The store's dense field (``<store>/dense``) as a reader, checked against the store: None (and a notice)
    when the store was built without it (``--no-dense``, or before it was recorded); a StoreError, never a
    silent serve without the prior, when the store was built with it and it is missing or incomplete, was
    written by another dense encoder than ``fingerprint`` or from another collection than the store's."""
    from aheadrank.store import StoreReader, read_manifest
    from aheadrank.store.manifest import collection_mismatch

    notices = notices if notices is not None else []
    main = main_reader.manifest if main_reader is not None else read_manifest(store)
    dense_dir = Path(store) / DENSE_DIR
    sub = read_manifest(dense_dir) if (dense_dir / "manifest.json").is_file() else None
    if sub is None or not sub.complete:
        state = "missing" if sub is None else f"incomplete ({sub.n_docs:,} of {main.n_docs:,} documents)"
        resume = (
            "its build was interrupted: re-run `aheadrank index` with the same flags to resume it (finished "
            "dense shards are reused), or with --no-dense to serve without the dense prior"
        )
        if main.dense or (sub is not None and main.dense is None):
            raise StoreError(
                f"the store {store} was built with the dense field, but {dense_dir} is {state}: {resume}"
            )
        why = "built with --no-dense" if main.dense is False else "built before the dense field existed"
        notices.append(
            f"the store has no dense field ({why}{'; its dense/ is ' + state if sub else ''}): serving without "
            "the dense prior; add it with `aheadrank index` (the ranker's fields are reused)"
        )
        return None
    reader = StoreReader(dense_dir, label=f"{DENSE_DIR}/")
    try:
        if reader.spec.fingerprint != fingerprint:
            raise StoreError(
                f"the dense field in {dense_dir} was written by dense encoder {reader.spec.fingerprint[:12]}, "
                f"but the checkpoint's priors were fitted with {fingerprint[:12]}: "
                "rebuild the store's dense field (`aheadrank index`) or refit the priors"
            )
        why = collection_mismatch(main, reader.manifest, f"the dense field {dense_dir}")
        if why is None and reader.manifest.n_docs != main.n_docs:
            why = f"the dense field {dense_dir} holds {reader.manifest.n_docs:,} documents, the store {main.n_docs:,}"
        if why is None and main_reader is not None and not reader.same_docids(main_reader):
            why = f"the dense field {dense_dir} holds other docids than the store"
        if why:
            raise StoreError(
                f"refusing the store {store}: {why}. Rebuild its dense field from the store's collection "
                "(delete dense/, then `aheadrank index` with the store's flags)"
            )
    except BaseException:
        reader.close()
        raise
    return reader


class PriorScorer:
    """Priors for one (checkpoint, store) pair; ``notices`` says what is unavailable and why."""

    def __init__(
        self,
        ranker,
        store: str | Path | None,
        device: str = "cpu",
        use_priors: bool = True,
        main_reader=None,
    ):
        self.priors: Priors | None = None
        self.calibration = None  # aheadrank.priors.Calibration: absolute, calibrated scores
        self.notices: list[str] = []
        self.dense_reader = None
        self.windows = None  # store/windows.py StoredPassages: the window prior's sub-store
        self._encoder = None
        self._ranker = ranker
        self._device = device
        raw = getattr(ranker, "priors", None) if use_priors else None
        if raw is None:
            if use_priors:
                self.notices.append(
                    "the checkpoint has no fitted priors (priors.json): serving the pure neural score; "
                    "fit them with `aheadrank fit-priors`"
                )
            return
        self.priors = Priors.from_dict(raw)
        self.calibration = self.priors.calibrated()
        if self.calibration is None:
            why = self.priors.fitted_on.get("calibration") or "fitted before it existed"
            self.notices.append(
                f"the checkpoint's priors have no calibration ({why}): /rerank's "
                "relevance_score is relative to the request's documents, not a probability; refit them "
                "with `aheadrank fit-priors`, or rebuild with more pseudo-queries (`aheadrank build --max-queries`)"
            )
        if self.priors.dense is None or store is None:
            return
        fingerprint = self.priors.dense["fingerprint"]
        self.dense_reader = open_dense_field(store, fingerprint, main_reader, self.notices)
        if self.dense_reader is not None and weighs_windows(self.priors):
            from aheadrank.store.windows import open_windows

            self.windows = open_windows(store, fingerprint, main_reader)
            if self.windows is None:
                self.notices.append(
                    "the checkpoint's priors weigh the bi-encoder's sentence windows, but the store has none: "
                    "serving without the window prior (`aheadrank build` stores them)"
                )

    # ---- what is available -------------------------------------------------------------------------
    def active(self, pure: bool = False) -> bool:
        """Whether a request is served with priors (fitted ones exist and it did not ask for ``pure``)."""
        return not pure and self.priors is not None

    def stored_dense_on(self, pure: bool = False) -> bool:
        """Whether a request over stored candidates gets the dense prior (the store has the field)."""
        return self.active(pure) and self.dense_reader is not None

    def encoder(self):
        """The dense query/document encoder (loaded on first use; its fingerprint must match the priors')."""
        if self._encoder is None:
            from aheadrank.rankers.dense import base_of, dense_encoder

            enc = dense_encoder(
                base_of(self._ranker.config), self.priors.dense.get("max_len", 256), self._device
            )
            if enc.fingerprint != self.priors.dense["fingerprint"]:
                raise StoreError(
                    f"the dense encoder here ({enc.fingerprint[:12]}) is not the one the priors were fitted "
                    f"with ({self.priors.dense['fingerprint'][:12]}): is the base model package another version?"
                )
            if getattr(self._ranker, "query_graphs", None) is not None and enc.query_graphs is None:
                enc.use_cuda_graphs()  # the ranker's query side is graphed: the dense query embedding too
            self._encoder = enc
        return self._encoder

    def query_vector(self, query: str) -> np.ndarray:
        return self.encoder().encode_queries([query])[0]

    def stored_dense(self, qvec: np.ndarray, docids: list[str]) -> np.ndarray | None:
        """Cosines of the query with the stored document embeddings; None without the dense field."""
        if self.dense_reader is None or not docids:
            return None
        return dense_cosines(self.dense_reader, qvec, docids)

    def stored_window(self, qvec: np.ndarray, docids: list[str], dense: np.ndarray) -> np.ndarray | None:
        """The documents' best window's cosines (:func:`window_cosines`); None without stored windows."""
        if self.windows is None or not docids:
            return None
        return window_cosines(self.windows, qvec, docids, dense)

    def text_dense(self, qvec: np.ndarray, texts: list[str]) -> np.ndarray:
        return self.encoder().encode_documents(texts) @ qvec

    def readers(self) -> list:
        """The sub-stores the priors read: the dense field (``dense/``) and the sentence windows (``windows/``)."""
        windows = self.windows.reader if self.windows is not None else None
        return [r for r in (self.dense_reader, windows) if r is not None]

    def close(self) -> None:
        if self.dense_reader is not None:
            self.dense_reader.close()
            self.dense_reader = None
        if self.windows is not None:
            self.windows.close()
            self.windows = None


# ---- the one scoring loop ---------------------------------------------------------------------------------
def stored_fields(fetched) -> dict:
    """A fetched batch's fields as the rankers take them: int8 fields (values + per-token scales, fetched
    with ``dequantize=False``) as :class:`QuantizedField`, which the scoring paths widen a block at a time."""
    from aheadrank.rankers import QuantizedField

    return {
        name: QuantizedField(v, fetched.scales[name]) if name in fetched.scales else v
        for name, v in fetched.fields.items()
    }


def score_stored(
    ranker,
    reader,
    qs,
    docids: list[str],
    seconds: dict[str, float],
    batch: int | None = None,
    passages=None,
    aggregation: str = DEFAULT_AGGREGATION,
    max_passages: int | None = None,
) -> tuple[list[tuple[str, float]], list[str]]:
    """Score ``docids`` (in batches of ``batch``, default the rankers' ``SCORE_BATCH``) from their stored
    fields: ``([(docid, score)] for the known ones in input order, [unknown docids])``; fetch and score time
    are added to ``seconds``. The one scoring loop that ``rerank-run`` and the service share; the public
    ``Ranker.score`` scores fields handed to it the same way (the stored dtype, the same batches), so all
    give the same scores (tests/test_score_paths.py).

    With ``passages`` (store/passages.py ``StoredPassages``: a store built with ``aheadrank index --passages``),
    a document stored as passages is scored by its passages (at most ``max_passages``, the first ones), each
    scored like a document, and gets :func:`aheadrank.passages.aggregate` of their scores (``aggregation``):
    what the service gives the same text sent ad hoc."""
    expanded = passages.expand(docids, max_passages) if passages is not None else {}
    if not expanded:
        return _score_fields(ranker, reader, qs, docids, seconds, batch)
    from aheadrank.passages import aggregate

    whole, unknown = _score_fields(
        ranker, reader, qs, [d for d in docids if d not in expanded], seconds, batch
    )
    pids = [p for ps in expanded.values() for p in ps]
    parts, lost = _score_fields(ranker, passages.reader, qs, pids, seconds, batch)
    if lost:
        raise StoreError(f"passages missing from {passages.reader.path}: {lost[:5]}")
    of_passage = dict(parts)
    ids = list(expanded)
    flat = [of_passage[p] for d in ids for p in expanded[d]]
    owner = [i for i, d in enumerate(ids) for _ in expanded[d]]
    # a non-finite passage score (damaged passages/ values) makes its document's score non-finite: never ranked
    bad = {owner[i] for i, s in enumerate(flat) if not math.isfinite(s)}
    agg = aggregate(flat, owner, len(ids), aggregation)
    by_docid = dict(whole) | {d: (math.nan if i in bad else agg[i]) for i, d in enumerate(ids)}
    return [(d, by_docid[d]) for d in docids if d in by_docid], unknown


def _score_fields(
    ranker, reader, qs, docids: list[str], seconds: dict[str, float], batch: int | None = None
) -> tuple[list[tuple[str, float]], list[str]]:
    """:func:`score_stored` of one store's entries, as they are stored."""
    import torch

    from aheadrank.rankers.base import SCORE_BATCH

    batch = batch or SCORE_BATCH

    scored: list[tuple[str, float]] = []
    unknown: list[str] = []
    for start in range(0, len(docids), batch):
        t0 = time.perf_counter()
        fetched = reader.fetch_torch(docids[start : start + batch], ranker.device, dequantize=False)
        t1 = time.perf_counter()
        if fetched.docids:
            with torch.inference_mode():
                fields = stored_fields(fetched)
                scores = ranker.score_batch(qs, fields, fetched.mask).float().cpu().tolist()
            scored.extend(zip(fetched.docids, scores, strict=True))
        seconds["fetch"] += t1 - t0
        seconds["score"] += time.perf_counter() - t1
        unknown.extend(fetched.unknown)
    return scored, unknown


def nonfinite_scores(scored: list[tuple[str, float]]) -> list[str]:
    """Docids whose score is NaN or infinite: their stored values are corrupt (ordering by them is undefined,
    so they must never be ranked)."""
    return [d for d, s in scored if not math.isfinite(s)]


def apply_priors(
    scorer: PriorScorer | None,
    scored: list[tuple[str, float]],
    bm25: dict[str, float | None] | None = None,
    dense: np.ndarray | None = None,
    pure: bool = False,
    seconds: dict[str, float] | None = None,
    window: np.ndarray | None = None,
) -> list[Scored]:
    """One query's neural scores ``[(docid, score)]`` -> ranked rows with the final score and its parts.

    ``bm25`` gives first-stage scores (the BM25 prior is used only when every candidate has one); ``dense``
    the cosines in ``scored``'s order (``PriorScorer.stored_dense`` or ``text_dense``), ``window`` the best
    windows' (``PriorScorer.stored_window``; used with ``dense`` only). ``pure`` (or no fitted priors) ranks by
    the neural score."""
    t0 = time.perf_counter()
    for d, s in scored:
        if not math.isfinite(s):
            raise StoreError(
                f"non-finite neural score for {d}: the stored fields of this document are damaged"
            )
    docids = [d for d, _ in scored]
    neural = np.array([s for _, s in scored], dtype=np.float64)
    b = None
    if bm25 is not None and docids and all(bm25.get(d) is not None for d in docids):
        b = np.array([bm25[d] for d in docids], dtype=np.float64)
    rows = [
        Scored(
            d,
            float(n),
            float(n),
            None if b is None else float(b[i]),
            None if dense is None else float(dense[i]),
            None if dense is None or window is None else float(window[i]),
        )
        for i, (d, n) in enumerate(zip(docids, neural, strict=True))
    ]
    if not pure and scorer is not None and scorer.priors is not None and rows:
        features = {"neural": neural}
        if b is not None:
            features["bm25"] = b
        if dense is not None:
            features["dense"] = np.asarray(dense, dtype=np.float64)
            if window is not None:
                features["window"] = np.asarray(window, dtype=np.float64)
        final = scorer.priors.combine(features)
        for row, f in zip(rows, final, strict=True):
            row.score = float(f)
    if seconds is not None:
        seconds["priors"] = seconds.get("priors", 0.0) + time.perf_counter() - t0
    by_docid = {r.docid: r for r in rows}
    return [by_docid[d] for d, _ in by_score((r.docid, r.score) for r in rows)]


def features_used(
    scorer: PriorScorer | None, bm25: bool, dense: bool, pure: bool = False, window: bool = False
) -> str:
    """The feature set a request is scored with (reported in responses)."""
    if pure or scorer is None or scorer.priors is None:
        return "neural"
    return subset_key(
        [
            "neural",
            *(["bm25"] if bm25 else []),
            *(["dense", *(["window"] if window else [])] if dense else []),
        ]
    )


# ---- fitting a checkpoint's priors on validation queries ---------------------------------------------------
def collect_features(
    checkpoint: str | Path,
    store: str | Path,
    queries: dict[str, str],
    candidates: dict[str, list[tuple[str, float]]],
    qrels: dict[str, dict[str, int]],
    device: str = "cpu",
    progress: bool = False,
    aggregation: str = DEFAULT_AGGREGATION,
    verify_store: str = "off",
) -> tuple[list, dict]:
    """Per validation query: neural scores through the store (the serving path; a document stored as passages
    gets ``aggregation`` of its passages' scores), BM25 and the dense cosines from the store's dense field (left
    out when the store has none), and the best windows' where the store has sentence windows (store/windows.py). Returns (QueryFeatures list, the dense encoder's fingerprint and length, or
    None without a dense field). ``verify_store`` ``start``: every shard it reads checked first, as
    rerank-run's (store.verify.verify_before_reading)."""
    from aheadrank.logs import progress_bar
    from aheadrank.priors import QueryFeatures
    from aheadrank.rankers import load_ranker
    from aheadrank.rankers.dense import base_of, dense_encoder
    from aheadrank.store import StoreReader
    from aheadrank.store.passages import open_passages

    reader = StoreReader(store)
    ranker = load_ranker(checkpoint, device=device, strategy=reader.spec.strategy)
    ranker.read_queries_up_to(QUERY_PIECES)
    reader.check_fingerprint(ranker.fingerprint)
    enc = dense_encoder(base_of(ranker.config), device=device)
    passages = open_passages(store, reader)  # long documents scored by their passages, as served
    dense_dir = Path(store) / DENSE_DIR
    dense_reader = StoreReader(dense_dir) if (dense_dir / "manifest.json").is_file() else None
    if dense_reader is not None and dense_reader.spec.fingerprint != enc.fingerprint:
        raise StoreError(f"the dense field in {dense_dir} was written by another dense encoder")
    windows = None
    if dense_reader is not None:
        from aheadrank.store.windows import open_windows

        windows = open_windows(store, enc.fingerprint, reader)  # the window prior, where the store has it
    out = []
    seconds = {"fetch": 0.0, "score": 0.0}
    try:
        from aheadrank.store.verify import verify_before_reading

        opened = [reader, passages.reader if passages is not None else None, dense_reader]
        verify_before_reading([*opened, windows.reader if windows is not None else None], verify_store)
        for qid in progress_bar(sorted(queries), desc="features", unit="q", disable=not progress):
            cands = candidates.get(qid, [])
            if not cands or not any(r > 0 for r in qrels.get(qid, {}).values()):
                continue
            qs = ranker.encode_query(queries[qid])
            scored, unknown = score_stored(
                ranker,
                reader,
                qs,
                [d for d, _ in cands],
                seconds,
                None,
                passages,
                aggregation=aggregation,
                max_passages=DEFAULT_MAX_PASSAGES,
            )
            if unknown:
                raise StoreError(f"validation candidates missing from the store {store}: {unknown[:5]}")
            docids = [d for d, _ in scored]
            bm25 = dict(cands)
            feats = {
                "neural": np.array([s for _, s in scored], dtype=np.float64),
                "bm25": np.array([bm25[d] for d in docids], dtype=np.float64),
            }
            if dense_reader is not None:
                qvec = enc.encode_queries([queries[qid]])[0]
                feats["dense"] = dense_cosines(dense_reader, qvec, docids)
                if windows is not None:
                    feats["window"] = window_cosines(windows, qvec, docids, feats["dense"])
            out.append(QueryFeatures(docids, feats, qrels[qid]))
    finally:
        reader.close()
        if passages is not None:
            passages.close()
        if dense_reader is not None:
            dense_reader.close()
        if windows is not None:
            windows.close()
    dense = {"fingerprint": enc.fingerprint, "max_len": enc.max_len} if dense_reader is not None else None
    return out, dense


def fit_checkpoint_priors(
    checkpoint: str | Path,
    store: str | Path,
    queries: dict[str, str],
    candidates: dict[str, list[tuple[str, float]]],
    qrels: dict[str, dict[str, int]],
    fitted_on: dict,
    device: str = "cpu",
    progress: bool = False,
    verify_store: str = "off",
    aggregation: str = DEFAULT_AGGREGATION,
    keep: dict | None = None,
) -> Priors:
    """Fit the priors on validation queries through the store and save them into the checkpoint (``verify_store``,
    ``aggregation``: as :func:`collect_features`; the aggregation is recorded in ``fitted_on``, and what serves
    the checkpoint reads it: :func:`aheadrank.passages.served_aggregation`). ``keep``: weights per feature set
    that fitted ones replace only where they serve better out of sample (:func:`aheadrank.priors.fit_priors`)."""
    from aheadrank.priors import fit_calibration, fit_priors
    from aheadrank.rankers.checkpoint import write_priors

    fitted_on = {**fitted_on, "passage_aggregation": aggregation}
    feats, dense = collect_features(
        checkpoint, store, queries, candidates, qrels, device, progress, aggregation, verify_store
    )
    if not feats:
        raise AheadrankError(
            f"none of the {len(queries):,} validation queries has a judged-relevant document among its BM25 "
            "candidates: nothing to fit the priors on (another split, --all-queries, or a deeper --depth?)"
        )
    priors = fit_priors(feats, dense, fitted_on, keep=keep)
    # the absolute score /rerank gives texts: one per feature set ("neural+dense" on a server without the index)
    priors.calibration = fit_calibration(feats, fitted_on).to_dict()
    write_priors(checkpoint, priors.to_dict())
    return priors
