"""The model side of the service: checkpoint + store + BM25 searcher behind one object.

Every method here runs on the service's single model thread (services/modelthread.py), so the ranker, which is
not thread-safe, is never used by two requests at once (requests take turns between scoring chunks:
``*_steps`` yield before each, services/turns.py); the asyncio side only queues work and answers.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

from aheadrank.services.budget import LatencyModel
from aheadrank.services.memory import bound_onednn_cache
from aheadrank.services.settings import ServiceSettings
from aheadrank.services.texts import (
    TextCache,
    stored_texts,
    text_features,
    whole_text_cosines,
    window_cosines_online,
)
from aheadrank.services.turns import drive

from aheadrank.errors import AheadrankError, CheckpointError, StoreError
from aheadrank.passages import (
    PassageOptions,
    aggregate,
    effective_overlap,
    flatten,
    split_passages,
)

log = logging.getLogger("aheadrank.service")
WARMUP_SEARCHES = 300
CALIBRATION_S = 3.0  # warm-up time spent fitting the latency model, once two chunk sizes are measured


class RequestError(AheadrankError):
    """Bad input the model side finds (unknown docids, no index configured): answered 4xx."""

    def __init__(self, message: str, kind: str = "bad_request", status: int = 422):
        super().__init__(message)
        self.kind = kind
        self.status = status


class Cancelled(AheadrankError):
    """The request was dropped on the model thread: its client went away or its deadline passed."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Work:
    """One request's control on the model thread: a server-side deadline (``time.perf_counter()`` clock) and a
    cancel flag the event loop sets when the client disconnects. Checked before the work starts and between
    scoring chunks; ``chunks_total``/``chunks_done`` say how far it got."""

    deadline: float = math.inf
    reason: str | None = None
    started: bool = False
    chunks_total: int = 0
    chunks_done: int = 0

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def check(self) -> None:
        if self.reason is None and time.perf_counter() >= self.deadline:
            self.reason = "deadline"
        if self.reason is not None:
            raise Cancelled(self.reason)


# the score of an ad-hoc text that is empty or whitespace only: it holds nothing to match, so it is not scored and
# ranks after every other text (a log-odds whose probability is 0.0 in floating point)
BLANK_SCORE = -1e4
SPLIT_CHARS_PER_TURN = 200_000  # characters tokenized per turn of the model thread (~0.1 s on one core)


def split_in_turns(
    tokenizer, texts: list[str], opts: PassageOptions, work: Work
) -> Generator[None, None, list[list[str]]]:
    """:func:`split_passages` of ``texts``, each distinct text once, in groups of about
    ``SPLIT_CHARS_PER_TURN`` characters with a turn for the other requests (and a check of ``work``) between
    groups: tokenizing is linear in the characters, and one turn for all of them held the model thread for
    seconds (a request of 250 texts of 20,000 characters: 3-10 s on the shared 2-core box)."""
    distinct = list(dict.fromkeys(texts))
    split: dict[str, list[str]] = {}
    group: list[str] = []
    size = 0
    for k, text in enumerate(distinct):
        group.append(text)
        size += len(text)
        if size >= SPLIT_CHARS_PER_TURN or k == len(distinct) - 1:
            if split:  # not before the first group: the request has just had its turn start
                yield
                work.check()
            split.update(zip(group, split_passages(tokenizer, group, opts), strict=True))
            group, size = [], 0
    return [split[t] for t in texts]


@dataclass
class StageClock:
    """Seconds per stage for one request."""

    seconds: dict[str, float] = field(
        default_factory=lambda: {
            "queue": 0.0,
            "bm25": 0.0,
            "query": 0.0,
            "fetch": 0.0,
            "score": 0.0,
            "encode": 0.0,
            "priors": 0.0,
        }
    )

    def ms(self) -> dict[str, float]:
        return {f"{k}_ms": round(v * 1e3, 3) for k, v in self.seconds.items()}


@dataclass
class RerankOutcome:
    ranked: list[tuple[str, float | None, float | None]]  # (docid, score or None, bm25 score or None)
    reranked: int
    candidates: int
    missing: list[str]
    planned_depth: int | None
    texts: dict[str, str]
    # docid -> (neural, dense, window)
    parts: dict[str, tuple[float, float | None, float | None]] = field(default_factory=dict)
    scoring: str = "neural"  # the feature set of the served scores (aheadrank/rerank.py)


def resolve_device(name: str) -> str:
    from aheadrank.devices import check_device

    return check_device(name, auto=True)


def open_stored_passages(settings: ServiceSettings, ranker, reader):
    """The store's long documents as passages (``aheadrank index --passages``, store/passages.py), or None.

    The service then reads ad-hoc texts at the store's passage window (the ranker's document length, which
    ``aheadrank index --max-doc-len`` may have shortened: the stored fields were encoded at it too), so a stored
    document and its text sent ad hoc are split alike; a --passage-overlap or --max-chunks-per-doc the stored
    passages cannot give is refused at start."""
    from aheadrank.store.passages import open_passages

    passages = open_passages(settings.store, reader)
    if passages is None:
        return None
    try:
        text = ranker._text()
        if passages.window != text.max_doc_len:
            ranker.limit_doc_len(passages.window)  # a CheckpointError when the checkpoint reads fewer pieces
            log.info("passage window %d word pieces, as the store's passages", passages.window)
        overlap = effective_overlap(passages.window, settings.passage_overlap)
        if overlap != passages.overlap:
            raise StoreError(
                f"refusing to start: the store {settings.store} holds passages that overlap by {passages.overlap} "
                f"word pieces, but this server would split texts with an overlap of {overlap}: start it with "
                f"--passage-overlap {passages.overlap}, or rebuild the store with `aheadrank index --passages "
                f"--passage-overlap {overlap}`"
            )
        most = passages.max_passages
        if most is not None and settings.max_chunks_per_doc > most:
            raise StoreError(
                f"refusing to start: the store {settings.store} holds at most {most} passages a document, but "
                f"--max-chunks-per-doc is {settings.max_chunks_per_doc}: start it with --max-chunks-per-doc {most}, "
                f"or rebuild the store with `aheadrank index --passages --max-chunks-per-doc "
                f"{settings.max_chunks_per_doc}`"
            )
    except BaseException:
        passages.close()
        raise
    return passages


class RerankBackend:
    def __init__(
        self,
        settings: ServiceSettings,
        ranker,
        reader=None,
        searcher=None,
        device: str = "cpu",
        scorer=None,
        passages=None,
    ):
        self.settings = settings
        self.ranker = ranker
        self.reader = reader
        self.passages = passages  # store/passages.py StoredPassages: the store's long documents as passages
        self.searcher = searcher
        self.device = device
        self.scorer = scorer  # aheadrank.rerank.PriorScorer: the priors of the served score
        self.latency = LatencyModel(settings.batch_size)
        self.ready = False
        self.warnings: list[str] = []
        self.model_name = f"{ranker.kind}:{Path(settings.checkpoint).name}"
        for notice in scorer.notices if scorer is not None else []:
            self.warnings.append(notice)
            log.warning(notice)
        if getattr(ranker, "fingerprint_notice", None):  # logged by load_ranker
            self.warnings.append(ranker.fingerprint_notice)
        if reader is not None and searcher is not None and searcher.num_docs != len(reader):
            self.warnings.append(
                f"the BM25 index holds {searcher.num_docs} documents but the store {len(reader)}: "
                "BM25 hits missing from the store are reported in `missing_from_store`"
            )
            log.warning(self.warnings[-1])
        self.text_cache = TextCache(settings.text_cache_entries, settings.text_cache_bytes)
        if reader is not None and reader.text_shards < len(reader.manifest.shards):
            self.warnings.append(
                f"the store has text digests in {reader.text_shards} of its {len(reader.manifest.shards)} shards "
                "(built before them): texts sent to /rerank that it holds elsewhere are encoded online; rebuild "
                "it with `aheadrank index --overwrite` to look them up"
            )
            log.warning(self.warnings[-1])

    # ---- start-up ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, settings: ServiceSettings) -> RerankBackend:
        """Open the store, check its fingerprint against the checkpoint (refuse on a mismatch), load the
        ranker on the device, open the Lucene searcher. Raises AheadrankError with a clear message."""
        from aheadrank.rankers import load_ranker, read_fingerprint

        from aheadrank.kernels import native

        bound_onednn_cache(settings.onednn_cache_capacity)  # before the model creates its first primitive
        os.environ[native.ENVIRONMENT] = settings.native  # what aheadrank/kernels/native.py reads
        native.library()  # the kernels built (or taken from the cache) at load, never on a request (--no-warmup too)
        if settings.threads:
            import torch

            torch.set_num_threads(settings.threads)
        device = resolve_device(settings.device)
        ckpt = Path(settings.checkpoint)
        try:
            ckpt_fp = read_fingerprint(ckpt)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read the fingerprint of checkpoint {ckpt}: {exc}") from exc
        reader = None
        strategy = None
        if settings.store is not None:
            from aheadrank.store import StoreReader

            reader = StoreReader(settings.store)
            if reader.spec.fingerprint != ckpt_fp:
                reader.close()
                raise StoreError(
                    f"refusing to start: the store {settings.store} was built by the checkpoint with "
                    f"fingerprint {reader.spec.fingerprint}, but --checkpoint {ckpt} has fingerprint {ckpt_fp}. "
                    "Serve the checkpoint that built the store, or rebuild the store with `aheadrank index`."
                )
            strategy = reader.spec.strategy
        from aheadrank.priors import recorded_aggregation

        # not given: what the checkpoint's priors were fitted with (a label-free build's maxp), said by /v1/info
        settings.passage_aggregation = recorded_aggregation(
            settings.passage_aggregation, ckpt, settings.priors
        )
        ranker = load_ranker(ckpt, device=device, strategy=strategy)
        ranker.read_queries_up_to(settings.max_query_len)  # longer than trained on, where positions allow
        if settings.cuda_graphs and device.startswith("cuda"):
            ranker.use_cuda_graphs()
        passages = None
        if reader is not None:
            reader.check_fingerprint(ranker.fingerprint)
            passages = open_stored_passages(settings, ranker, reader)
        searcher = None
        if settings.index is not None:
            from aheadrank.indexer.bm25 import Bm25Searcher, set_java_heap

            set_java_heap(settings.java_heap)  # before the JVM starts: bounded, not a quarter of the machine
            # a query within --max-query-chars never meets Lucene's clause limit (indexer/bm25.py)
            searcher = Bm25Searcher(settings.index, max_clauses=settings.max_query_chars)
            try:  # an index copied without its texts/ folder: refused here, not on the first request for text
                searcher.check_texts()
            except AheadrankError:
                searcher.close()
                raise
        from aheadrank.rerank import PriorScorer

        try:
            scorer = PriorScorer(
                ranker, settings.store, device, use_priors=settings.priors, main_reader=reader
            )
        except BaseException:
            if passages is not None:
                passages.close()
            if reader is not None:
                reader.close()
            raise
        return cls(settings, ranker, reader, searcher, device, scorer, passages)

    # ---- the store and its sub-stores, guarded alike ------------------------------------------------
    def readers(self) -> list:
        """The open stores: the ranker's, its passages (``passages/``), its dense field (``dense/``) and sentence
        windows (``windows/``) when the served score uses them."""
        passages = self.passages.reader if self.passages is not None else None
        priors = self.scorer.readers() if self.scorer is not None else []
        return [r for r in (self.reader, passages) if r is not None] + priors

    def watch(self) -> None:
        """File leases on every shard of every open store (StoreReader.watch); where one cannot be had, a
        WARNING and an entry in /v1/info's ``warnings`` (and /ready's ``store.lease``)."""
        for reader in self.readers():
            if not reader.watch() and reader.lease and reader.lease != "held":
                self.warnings.append(reader.lease)

    def lease_state(self) -> str | None:
        """ "held" (every shard of every store leased), "none" (some not: see ``warnings``), or None (no store
        or not watched)."""
        states = [r.lease for r in self.readers()]
        if not states or None in states:
            return None
        return "held" if all(s == "held" for s in states) else "none"

    def check_shards(self) -> dict[str, str]:
        """``{shard: reason}`` of every refused shard of every open store (``dense/…`` for the dense field)."""
        damaged: dict[str, str] = {}
        for reader in self.readers():
            damaged.update(reader.check_shards())
        return damaged

    def verification(self):
        """The store verification (store.verify.ShardVerification) of ``--verify-store``, made once."""
        if getattr(self, "_verification", None) is None:
            from aheadrank.store.verify import ShardVerification

            self._verification = ShardVerification(self.readers(), self.settings.verify_store)
        return self._verification

    def verify_at_start(self) -> None:
        """``--verify-store start``: every shard's sha256 now; a mismatch refuses to start, naming the shards."""
        verification = self.verification()
        if verification.run():
            raise StoreError(
                f"refusing to start: the store {self.settings.store} does not verify: {verification.refused_line()}. Run "
                "`aheadrank verify-store`, restore the shards or rebuild them (`aheadrank index` resumes)"
            )

    def warmup(self) -> dict:
        """Run every path once and fit the latency model on this machine; then the backend is ready."""
        t0 = time.perf_counter()
        if self.searcher is not None:  # the JVM compiles Lucene's search path after some hundred calls
            words = ["cell", "protein", "cancer", "risk", "gene", "study", "effect", "patients", "model"]
            for i in range(WARMUP_SEARCHES):
                self.searcher.search(" ".join(words[j % len(words)] for j in range(i, i + 3)), 100)
                if time.perf_counter() - t0 > 2.0:
                    break
        if self.ranker.query_graphs is not None:  # every query length: no capture inside a request
            from aheadrank.rankers.graphs import query_lengths

            self.ranker.query_graphs.capture_all(query_lengths(self.ranker._text().max_query_len))
            if self.stored_dense_on(False):  # the dense prior's query embedding, graphed alike
                dense = self.scorer.encoder()
                if dense.query_graphs is not None:
                    dense.query_graphs.capture_all(query_lengths(dense.max_query_len), dense.text.pad)
        qs = self.ranker.encode_query("warm up the query encoder")
        self.score_texts("warm up", ["warm up the document encoder"])
        # the latency model is fitted on what a request costs: with the dense prior, its fetch too
        qvec = self.scorer.query_vector("warm up the query encoder") if self.stored_dense_on(False) else None
        if self.reader is not None and len(self.reader):
            ids = self.reader.docids()[: self.settings.batch_size]
            sizes = sorted({max(1, len(ids) // 16), max(1, len(ids) // 4), max(1, len(ids) // 2), len(ids)})
            self._score_chunk(qs, ids[: sizes[0]], {"fetch": 0.0, "score": 0.0}, qvec, {})  # first touch
            samples: list[tuple[int, float]] = []
            calibrate_until = time.perf_counter() + CALIBRATION_S  # a slow ranker (bert) gets fewer samples
            for _ in range(3):
                for n in sizes:
                    if len({m for m, _ in samples}) >= 2 and time.perf_counter() > calibrate_until:
                        break
                    t = time.perf_counter()
                    self._score_chunk(qs, ids[:n], {"fetch": 0.0, "score": 0.0}, qvec, {})
                    samples.append((n, time.perf_counter() - t))
            if len({n for n, _ in samples}) >= 2:
                self.latency.fit(samples)
        self.ready = True
        took = time.perf_counter() - t0
        log.info("warm-up done in %.2f s; latency model %s", took, self.latency.describe())
        return {"seconds": took, **self.latency.describe()}

    def close(self) -> None:
        self.ready = False
        if getattr(self, "_verification", None) is not None:
            self._verification.stop()
        if self.scorer is not None:
            self.scorer.close()
        if self.passages is not None:
            self.passages.close()
        if self.searcher is not None:
            self.searcher.close()
        if self.reader is not None:
            self.reader.close()

    # ---- requests (model thread) ------------------------------------------------------------------
    def _score_chunk(
        self,
        qs,
        docids: list[str],
        seconds: dict[str, float],
        qvec=None,
        dense: dict | None = None,
        max_passages: int | None = None,
        window: dict | None = None,
    ) -> list[tuple[str, float]]:
        """Neural scores of one chunk; with a dense query vector, the chunk's dense cosines go into
        ``dense`` and, where the store has sentence windows, their best windows' into ``window`` (their fetch
        counts as fetch time, so the latency model includes the priors). A document the
        store holds as passages is scored by its first ``max_passages`` (default --max-chunks-per-doc) and
        --passage-aggregation, as its text sent ad hoc."""
        from aheadrank.rerank import score_stored

        s = self.settings
        scored, unknown = score_stored(
            self.ranker,
            self.reader,
            qs,
            docids,
            seconds,
            s.batch_size,
            self.passages,
            s.passage_aggregation,
            max_passages or s.max_chunks_per_doc,
        )
        if unknown:  # checked before scoring; a store that changed under us is a server-side fault
            raise StoreError(f"docids vanished from the store while serving: {unknown[:5]}")
        self._refuse_nonfinite(scored)
        if qvec is not None and dense is not None and scored:
            t = time.perf_counter()
            ids = [d for d, _ in scored]
            cos = self.scorer.stored_dense(qvec, ids)
            dense.update(zip(ids, cos.tolist(), strict=True))
            best = self.scorer.stored_window(qvec, ids, cos) if window is not None else None
            if best is not None:
                window.update(zip(ids, best.tolist(), strict=True))
            seconds["fetch"] += time.perf_counter() - t
        return scored

    def uses_priors(self, pure: bool) -> bool:
        return self.scorer is not None and self.scorer.active(pure)

    def stored_dense_on(self, pure: bool) -> bool:
        return self.scorer is not None and self.scorer.stored_dense_on(pure)

    def _refuse_nonfinite(self, scored: list[tuple[str, float]]) -> None:
        """NaN/inf scores come from corrupt stored values: never ranked; their shards are refused from now
        on (reported by /ready, /metrics and the log) and this request is answered 503."""
        from aheadrank.errors import StoreDamagedError
        from aheadrank.rerank import nonfinite_scores

        bad = nonfinite_scores(scored)
        if bad:
            why = f"non-finite stored values (documents {bad[:3]})"
            split = self.passages.counts if self.passages is not None else {}
            files = self.reader.mark_damaged([d for d in bad if d not in split], why)
            if split:
                files += self.passages.mark_damaged([d for d in bad if d in split], why)
            raise StoreDamagedError(
                f"the store holds corrupt (non-finite) values for {len(bad)} candidate(s) {bad[:5]} in "
                f"{files}; those shards are refused until the store is repaired (aheadrank verify-store)",
                files,
            )

    def check_candidates(self, docids: list[str]) -> None:
        """Refuse duplicate and unknown docids with a message that names them (never a silent zero)."""
        seen, dupes = set(), []
        for d in docids:
            if d in seen:
                dupes.append(d)
            seen.add(d)
        if dupes:
            raise RequestError(
                f"duplicate docids in candidates: {sorted(set(dupes))[:10]}", "duplicate_docid"
            )
        known = self.reader.known(docids)
        unknown = [d for d, k in zip(docids, known, strict=True) if not k]
        if unknown:
            raise RequestError(
                f"{len(unknown)} unknown docid(s), not in the store: {unknown[:10]}", "unknown_docid", 404
            )

    def rerank(self, *args, **kwargs) -> RerankOutcome:
        """:meth:`rerank_steps` run to its end in the calling thread."""
        return drive(self.rerank_steps(*args, **kwargs))

    def bm25_on(self, pure: bool) -> bool:
        """Whether the served score weighs BM25: the server has the index and the priors a feature set with it."""
        if self.searcher is None or not self.uses_priors(pure):
            return False
        return any("bm25" in key.split("+") for key in self.scorer.priors.weights)

    def given_bm25(self, query: str, docids: list[str], pure: bool) -> dict[str, float]:
        """The BM25 scores of documents the client names (its candidates, or stored texts it sends) for ``query``,
        the scores BM25's own candidates carry (:meth:`Bm25Searcher.doc_scores`), where :meth:`bm25_on`. Empty
        otherwise."""
        if not docids or not self.bm25_on(pure):
            return {}
        return self._doc_bm25(query, docids)

    def _doc_bm25(self, query: str, docids: list[str]) -> dict[str, float]:
        """:meth:`Bm25Searcher.doc_scores`, a query too complex for it a 413."""
        from aheadrank.indexer.bm25 import QueryTooComplexError

        if not docids:
            return {}
        try:
            return self.searcher.doc_scores(query, docids)
        except QueryTooComplexError as exc:
            raise RequestError(str(exc), "query_too_complex", 413) from exc

    def texts_bm25(
        self, query: str, texts: list[str], docids: list[str | None], pure: bool
    ) -> list[float | None]:
        """The BM25 score of each text of a /rerank request, where :meth:`bm25_on` (all ``None`` otherwise): a text
        the store holds gets its document's (:meth:`Bm25Searcher.doc_scores`), any other the score it would have as
        one more document of the index (:meth:`Bm25Searcher.text_scores`: the index's statistics; equal to its
        document's for a text the index holds)."""
        if not texts or not self.bm25_on(pure):
            return [None] * len(texts)
        known = self._doc_bm25(query, [d for d in docids if d is not None])
        scores = [None if d is None else known.get(d) for d in docids]
        other = [i for i, score in enumerate(scores) if score is None]
        for i, score in zip(other, self.searcher.text_scores(query, [texts[i] for i in other]), strict=True):
            scores[i] = score
        return scores

    def rerank_steps(
        self,
        query: str,
        candidates: list[str] | None,
        depth: int,
        budget_ms: float | None,
        arrival: float,
        clock: StageClock,
        want_text: bool = False,
        work: Work | None = None,
        pure: bool = False,
    ) -> Generator[None, None, RerankOutcome]:
        """Re-rank, yielding before each scoring chunk (the model thread's turns: services/turns.py)."""
        from aheadrank.rerank import apply_priors, features_used

        start = time.perf_counter()
        clock.seconds["queue"] = start - arrival
        if self.reader is None:
            raise RequestError(
                "this server has no representation store (start it with --store)", "no_store", 503
            )
        if want_text and self.searcher is None:  # refused before any work
            raise RequestError(
                "return_text needs the Lucene index (start the server with --index)", "no_index"
            )
        if candidates is None:
            if self.searcher is None:
                raise RequestError(
                    "this server has no BM25 index (start it with --index): give `candidates`",
                    "no_index",
                    422,
                )
            from aheadrank.indexer.bm25 import QueryTooComplexError

            try:
                hits: list[tuple[str, float | None]] = list(self.searcher.search(query, depth))
            except QueryTooComplexError as exc:
                raise RequestError(str(exc), "query_too_complex", 413) from exc
            known = self.reader.known([d for d, _ in hits])
            missing = [d for (d, _), k in zip(hits, known, strict=True) if not k]
            head = [(d, s) for (d, s), k in zip(hits, known, strict=True) if k]
        else:
            self.check_candidates(candidates)
            # their BM25 scores as BM25's own candidates carry them, where the index and the priors have BM25
            given = self.given_bm25(query, candidates, pure)
            hits = [(d, given.get(d)) for d in candidates]
            missing, head = [], hits
        t = time.perf_counter()
        clock.seconds["bm25"] = t - start
        qs = self.ranker.encode_query(query)
        priors = self.uses_priors(pure)
        qvec = self.scorer.query_vector(query) if self.stored_dense_on(pure) else None
        dense: dict[str, float] = {}
        window: dict[str, float] | None = {} if qvec is not None and self.scorer.windows is not None else None
        clock.seconds["query"] = time.perf_counter() - t

        ids = [d for d, _ in head]
        planned = None
        work = work or Work()
        step = self.settings.batch_size
        work.chunks_total = math.ceil(len(ids) / step)

        def score(chunk: list[str]) -> list:
            """One chunk scored and timed: every chunk, budgeted or not, updates the budgets' latency model."""
            t = time.perf_counter()
            got = self._score_chunk(qs, chunk, clock.seconds, qvec, dense, window=window)
            self.latency.observe(len(chunk), time.perf_counter() - t)
            return got

        if budget_ms is None:  # chunk by chunk (the same batches as one call), checking the request between
            scored = []
            for begin in range(0, len(ids), step):
                yield
                work.check()
                scored += score(ids[begin : begin + step])
                work.chunks_done += 1
        else:
            deadline = arrival + budget_ms / 1e3
            planned = self.latency.depth_for(deadline - time.perf_counter(), len(ids))
            scored = []
            while len(scored) < len(ids):
                yield  # before planning: the turns of other requests spend this one's budget too
                left = deadline - time.perf_counter()
                n = min(self.latency.depth_for(left, len(ids) - len(scored)), self.settings.batch_size)
                if n <= 0 and not scored:  # an estimate too high to let any chunk run is tried, now and then
                    n = min(self.latency.probe_size(left), len(ids))
                if n <= 0:
                    break
                work.check()
                scored += score(ids[len(scored) : len(scored) + n])
                work.chunks_done += 1
        bm25 = dict(hits)
        rows = apply_priors(
            self.scorer,
            scored,
            bm25,
            [dense[d] for d, _ in scored] if qvec is not None else None,
            pure=not priors,
            seconds=clock.seconds,
            window=[window[d] for d, _ in scored] if window is not None else None,
        )
        ranked = [(r.docid, r.score, bm25[r.docid]) for r in rows]
        ranked += [(d, None, bm25[d]) for d in ids[len(scored) :]]  # the tail keeps first-stage order
        ranked += [(d, None, bm25[d]) for d in missing]
        texts = self.searcher.doc_texts([d for d, _, _ in ranked]) if want_text else {}
        parts = {r.docid: (r.neural, r.dense, r.window) for r in rows}
        # BM25's candidates carry its scores (none found: still BM25's); given ones where the index scored them all
        has_bm25 = candidates is None or (bool(hits) and all(s is not None for _, s in hits))
        scoring = features_used(
            self.scorer, has_bm25, qvec is not None, pure=not priors, window=window is not None
        )
        return RerankOutcome(ranked, len(scored), len(hits), missing, planned, texts, parts, scoring)

    def blank_query(self, query: str) -> bool:
        """Whether the query makes no word piece (only spaces, zero-width or control characters): refused, not
        scored as ``[UNK]`` (on the model thread: the tokenizer's truncation state is not shared across threads)."""
        return self.ranker._text().blank([query])[0]

    def overlong(self, texts: list[str]) -> list[tuple[int, int]]:
        """(index, word pieces) of the texts longer than the model reads (``max_doc_len``): what TEI's
        ``truncate: false`` refuses instead of cutting."""
        text = self.ranker._text()
        pieces = text.all_pieces(texts)
        return [(i, len(p)) for i, p in enumerate(pieces) if len(p) > text.max_doc_len]

    def max_doc_len(self) -> int:
        return int(self.ranker._text().max_doc_len)

    def score_texts(self, *args, **kwargs) -> tuple[list[float], int]:
        """:meth:`score_texts_steps` run to its end in the calling thread."""
        return drive(self.score_texts_steps(*args, **kwargs))

    def score_texts_steps(
        self,
        query: str,
        texts: list[str],
        clock: StageClock | None = None,
        work: Work | None = None,
        pure: bool = False,
        passages: PassageOptions | None = None,
    ) -> Generator[None, None, tuple[list[float], int]]:
        """Ad-hoc documents: a text the store holds scored from its stored fields as its docid would be, the
        others from the cache of texts encoded before or encoded online (services/texts.py), checking ``work``
        (deadline, client gone) before each chunk. With priors (and unless ``pure``) the score is
        the neural score combined with the dense prior (stored, or computed online) and, on a server with the
        index, the text's BM25 score (:meth:`texts_bm25`), by :meth:`text_scores`: with the checkpoint's
        calibration, each text's calibrated log-odds of relevance, which do not depend on the request's other
        texts (:meth:`score_kind`); without, standardised over the request's texts.
        A text longer than the ranker's window is split into ``passages`` (default: :meth:`passage_options`)
        and gets a score from its passages' (--passage-aggregation, aheadrank/passages.py). Returns (scores in
        input order, tokens); a text that makes no word piece (empty, spaces, zero-width or control characters
        only) gets ``BLANK_SCORE``, unscored."""
        import numpy as np

        clock = clock or StageClock()
        work = work or Work()
        blank = {i for i, b in enumerate(self.ranker._text().blank(texts)) if b}
        if blank:  # BLANK_SCORE for those, the others scored among themselves (z-scores without them)
            kept = [i for i in range(len(texts)) if i not in blank]
            scores, tokens = [BLANK_SCORE] * len(texts), 0
            if kept:
                part, tokens = yield from self.score_texts_steps(
                    query, [texts[i] for i in kept], clock, work, pure, passages
                )
                for i, score in zip(kept, part, strict=True):
                    scores[i] = score
            return scores, tokens
        t = time.perf_counter()
        qs = self.ranker.encode_query(query)
        dense_on = self.uses_priors(pure) and self.scorer.priors.dense is not None
        qvec = self.scorer.query_vector(query) if dense_on else None
        clock.seconds["query"] = time.perf_counter() - t
        # a text the store holds is scored as its docid (its stored fields, or its stored passages: the same
        # split as the one below); only the others are split here
        split = [[x] for x in texts]
        opts = passages or self.passage_options()
        docids = stored_texts(self, texts, opts.max_pieces)
        todo = [i for i, docid in enumerate(docids) if docid is None]
        parts = yield from split_in_turns(self.ranker._text().tokenizer, [texts[i] for i in todo], opts, work)
        for i, p in zip(todo, parts, strict=True):
            split[i] = p
        flat, owner = flatten(split)
        whole = [len(p) == 1 for p in split]  # a text read as one passage has its own dense cosine
        # stored texts from the store, the others from the cache or encoded online (services/texts.py)
        scores, dense, tokens, best = yield from text_features(
            self, qs, qvec, flat, clock, work, opts.max_passages, [whole[i] for i in owner]
        )
        read = [p[0] for p in split]  # each text as it is read (a max_tokens_per_doc cut: the cut text)
        long = [i for i, w in enumerate(whole) if not w]
        # a long text's whole (cut) text: what its dense cosine and its BM25 score read
        if long and (qvec is not None or self.bm25_on(pure)):
            heads = [texts[i] for i in long]
            cut = opts.head()
            if cut is not None:  # max_tokens_per_doc: the text as cut (tokenized in turns, as the split)
                tokenizer = self.ranker._text().tokenizer
                heads = [p[0] for p in (yield from split_in_turns(tokenizer, heads, cut, work))]
            for i, head in zip(long, heads, strict=True):
                read[i] = head
        if long:  # a long text scored as its docid is: the passages' neural scores
            scores = aggregate(scores, owner, len(texts), self.settings.passage_aggregation)
            if qvec is not None:  # ... aggregated (--passage-aggregation), then the whole text's cosine
                at = {}
                for k, i in enumerate(owner):
                    at.setdefault(i, k)
                cosines = [float(dense[at[i]]) for i in range(len(texts))]  # a text read whole: its own
                found = yield from whole_text_cosines(self, qvec, [read[i] for i in long], clock, work)
                for i, c in zip(long, found, strict=True):
                    cosines[i] = c
                dense = np.array(cosines)
                best = np.array([float(best[at[i]]) for i in range(len(texts))]) if best is not None else None
        if best is not None:  # the best sentence window's cosine, as the docid's (stored ones from the store)
            online = [i for i in range(len(texts)) if not math.isfinite(best[i])]
            if online:
                found = yield from window_cosines_online(
                    self, qvec, [read[i] for i in online], dense[online], clock, work
                )
                best[online] = found
        if self.uses_priors(pure):
            t = time.perf_counter()
            if not all(math.isfinite(s) for s in scores):
                raise StoreError("non-finite neural score for an ad-hoc document")
            features = {"neural": np.array(scores)}
            if qvec is not None:
                features["dense"] = dense
            if best is not None:
                features["window"] = best
            # BM25: a text the store holds its document's score, another its own as read (the index's statistics)
            bm25 = self.texts_bm25(query, read, docids, pure)
            t_bm25 = time.perf_counter()
            clock.seconds["bm25"] += t_bm25 - t
            scores = self.text_scores(features, bm25).tolist()
            clock.seconds["priors"] += time.perf_counter() - t_bm25
        return scores, tokens

    def text_scores(self, features: dict, bm25: list[float | None]):
        """/rerank's scores of texts from their ``features`` and, where known (:meth:`texts_bm25`: every text on a
        server with the index), their BM25 scores: with the checkpoint's calibration, each text's own calibrated
        log-odds, from the feature set it has (a probability either way, so texts with and without BM25 would rank
        together); without, standardised over the request's texts, with BM25 only where every text has it."""
        import numpy as np

        from aheadrank.priors import subset_key

        have = [i for i, b in enumerate(bm25) if b is not None]
        cal = self.scorer.calibration
        with_bm25 = subset_key([*features, "bm25"])
        if cal is not None:  # each text's own log-odds of relevance
            out = cal.logits(features)
            if have and with_bm25 in cal.platt:
                part = {k: v[have] for k, v in features.items()}
                part["bm25"] = np.array([bm25[i] for i in have], dtype=np.float64)
                out[have] = cal.logits(part)
            return out
        # priors fitted before calibration: standardised over the request's texts
        if len(have) == len(bm25) and with_bm25 in self.scorer.priors.weights:
            features = {**features, "bm25": np.array(bm25, dtype=np.float64)}
        return self.scorer.priors.combine(features)

    def passage_options(
        self, max_chunks: int | None = None, max_tokens: int | None = None, cut: bool = False
    ) -> PassageOptions:
        """How /rerank reads a text longer than the ranker's window: passages of the window, at most
        ``max_chunks`` (Cohere's; capped by --max-chunks-per-doc), the text cut to ``max_tokens`` pieces
        first (Cohere v2's ``max_tokens_per_doc``); ``cut`` (TEI's ``truncate: true``): the first window only."""
        window = self.max_doc_len()
        chunks = (
            1
            if cut
            else min(max_chunks or self.settings.max_chunks_per_doc, self.settings.max_chunks_per_doc)
        )
        return PassageOptions(
            window, effective_overlap(window, self.settings.passage_overlap), chunks, max_tokens
        )

    def score_kind(self, pure: bool = False) -> str:
        """What /rerank's ``relevance_score`` (the sigmoid of :meth:`score_texts`' scores) is: 'calibrated'
        (the probability of relevance, fitted on held-out queries; each text's own), 'relative' (priors
        without calibration: standardised over the request's texts, so it depends on the others) or
        'uncalibrated' (the ranker's own score: each text's own, but not a probability)."""
        if not self.uses_priors(pure):
            return "uncalibrated"
        return "calibrated" if self.scorer.calibration is not None else "relative"

    # ---- info ------------------------------------------------------------------------------------------
    def priors_info(self) -> dict | None:
        p = self.scorer.priors if self.scorer is not None else None
        if p is None:
            return None
        cal = self.scorer.calibration
        return {
            "weights": p.weights,
            "relevance_score": self.score_kind(),
            "calibration": None
            if cal is None
            else {
                "method": cal.method,
                "feature_sets": sorted(cal.platt),
                "fitted_on": {
                    k: v
                    for k, v in cal.fitted_on.items()
                    if k in ("labels", "split", "queries", "candidates", "relevant")
                },
            },
            "dense_field": self.scorer.dense_reader is not None,
            "windows": self.scorer.windows is not None,
            "fitted_on": {
                k: v for k, v in p.fitted_on.items() if k in ("split", "queries", "depth", "val_ndcg10")
            },
        }

    def info(self) -> dict:
        import torch

        from aheadrank import __version__

        model = {
            "name": self.model_name,
            "checkpoint": Path(self.settings.checkpoint).name,  # names only: no server paths to clients
            "fingerprint": self.ranker.fingerprint,
            **self.ranker.describe(),
            "query_len": self.ranker._text().max_query_len,  # pieces read (--max-query-len, where allowed)
            "passage_window": self.max_doc_len(),  # longer /rerank texts: passages (--max-chunks-per-doc)
            "passage_aggregation": self.settings.passage_aggregation,  # their score from the passages'
        }
        store = None
        if self.reader is not None:
            spec = self.reader.spec
            store = {
                "path": Path(self.settings.store).name,
                "documents": len(self.reader),
                "bytes": self.reader.manifest.n_bytes,
                "shards": len(self.reader.manifest.shards),
                "fields": spec.fields,
                "dtype": spec.dtype,
                "compression": spec.compression,
                "fingerprint": spec.fingerprint,
                "dense_field": self.scorer is not None and self.scorer.dense_reader is not None,
                "passages": None
                if self.passages is None
                else {**self.passages.record, "documents": len(self.passages.counts)},
                "windows": None
                if self.scorer is None or self.scorer.windows is None
                else {**self.scorer.windows.record, "documents": len(self.scorer.windows.counts)},
                "lease": self.lease_state(),
                "verification": self.verification().status(),
            }
        index = None
        if self.searcher is not None:
            index = {
                "path": Path(self.settings.index).name,
                "documents": self.searcher.num_docs,
                "k1": self.searcher.k1,
                "b": self.searcher.b,
                "language": self.searcher.language,  # its analyzer's (indexer/language.py)
            }
        device = self.device
        if device.startswith("cuda"):
            device = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
        s = self.settings
        return {
            "model": model,
            "store": store,
            "index": index,
            "device": device,
            "limits": {
                "max_candidates": s.max_candidates,
                "max_documents": s.max_documents,
                "max_query_chars": s.max_query_chars,
                "max_document_chars": s.max_document_chars,
                "max_body_bytes": s.max_body_bytes,
                "max_queue": s.max_queue,
                "default_depth": s.default_depth,
                "request_timeout_s": s.request_timeout_s,
            },
            "latency": self.latency.describe(),
            "priors": self.priors_info(),
            "relevance_score": self.score_kind(),
            "version": __version__,
            "warnings": self.warnings,
        }
