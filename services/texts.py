"""Ad-hoc texts (``/rerank``, ``/v1/rerank`` and ``/v2/rerank`` with ``documents``): looked up, cached, or encoded.

Each text of a request is recognised by its digest (store/texts.py: sha256 of the NFC, whitespace-collapsed
text) and served the cheapest way there is:

1. **stored** — the store holds a document with that text (``aheadrank index`` writes the digests): its stored
   fields and dense vector are scored exactly as a docid of ``/v1/rerank`` (the same fetch-and-score chunks);
2. **cached** — it was encoded online before: its fields (and dense vector) come from :class:`TextCache`, a
   bounded LRU keyed by (text digest, checkpoint fingerprint);
3. **encoded** — otherwise its document side runs online (length-sorted batches of ``doc_batch_size``), and the
   result goes into the cache.

Equal texts in one request are scored once. Everything here runs on the service's model thread; the cache's
lock only guards it against ``/metrics`` reading its counters from the event loop.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aheadrank.store.texts import text_digest

SOURCES = ("stored", "cached", "encoded")
# sentence windows embedded per turn, in --doc-batch-size units (the --ad-hoc-windows prior: window_cosines_online):
# a chunk of the longest windows then takes about as long as one of the ranker's chunks (measured by
# bench/ad_hoc_windows_cost.py: 4 made turns of 1.0 s against the ranker's 0.42 s on Cranfield)
WINDOWS_PER_DOC_BATCH = 2


@dataclass
class Encoded:
    """One text's online-encoded document side: its fields ([len, dim] float32 arrays of their own, as
    ``encode_documents`` computes them) and, once the dense prior needed it, its dense embedding."""

    fields: dict[str, np.ndarray]
    dense: np.ndarray | None = None

    @classmethod
    def of(cls, fields: dict[str, Any]) -> Encoded:
        """From ``encode_documents``' tensors (views into their batch: copied, so the batch is not kept)."""
        return cls({k: np.array(v.detach().cpu().numpy(), dtype=np.float32) for k, v in fields.items()})

    @property
    def tokens(self) -> int:
        return int(next(iter(self.fields.values())).shape[0])

    @property
    def nbytes(self) -> int:
        size = sum(int(v.nbytes) for v in self.fields.values())
        return size + (int(self.dense.nbytes) if self.dense is not None else 0)


@functools.lru_cache(maxsize=2048)
def _digest(text: str) -> bytes:
    """:func:`text_digest`, remembered for the texts of the last requests (a request looks each text up twice:
    whole, then as passages)."""
    return text_digest(text)


def score_encoded(ranker, qs, entries: list[Encoded]) -> list[float]:
    """Scores of online-encoded documents: padded in one numpy buffer per field (one copy per document, no
    torch op per document), then one ``score_batch``, as stored candidates are scored."""
    import torch

    lengths = np.array([e.tokens for e in entries])
    width = int(lengths.max())
    fields = {}
    for name, first in entries[0].fields.items():
        buf = np.zeros((len(entries), width, first.shape[1]), dtype=np.float32)
        for i, e in enumerate(entries):
            buf[i, : lengths[i]] = e.fields[name]
        fields[name] = torch.from_numpy(buf).to(ranker.device)
    mask = torch.from_numpy(np.arange(width)[None, :] < lengths[:, None]).to(ranker.device)
    with torch.inference_mode():
        return ranker.score_batch(qs, fields, mask).float().cpu().tolist()


@dataclass
class TextCache:
    """A bounded LRU of :class:`Encoded` texts keyed by (text digest, checkpoint fingerprint): at most
    ``max_entries`` entries and ``max_bytes`` bytes of tensors (either 0: off). Thread-safe."""

    max_entries: int
    max_bytes: int
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    sources: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    _items: OrderedDict = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: tuple[bytes, str]) -> Encoded | None:
        if not self.enabled:
            return None
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: tuple[bytes, str], entry: Encoded) -> None:
        """Keep ``entry`` (replacing what ``key`` held: put it again once it grew), evicting the least recently
        used entries until both bounds hold; an entry larger than ``max_bytes`` on its own is not kept."""
        size = entry.nbytes
        if not self.enabled:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                return
            while self._items and (
                len(self._items) >= self.max_entries or self.bytes + size > self.max_bytes
            ):
                _, (_, dropped) = self._items.popitem(last=False)
                self.bytes -= dropped
                self.evictions += 1
            self._items[key] = (entry, size)
            self.bytes += size

    def count(self, source: str, n: int) -> None:
        with self._lock:
            self.sources[source] += n

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "entries": len(self._items),
                "bytes": self.bytes,
                "max_entries": self.max_entries,
                "max_bytes": self.max_bytes,
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "texts": dict(self.sources),
            }


def stored_texts(backend, texts: list[str], max_pieces: int | None = None) -> list[str | None]:
    """The docid of each of ``texts`` the store holds (by text digest), None for the others: those are scored as
    their docids. With ``max_pieces`` (Cohere's ``max_tokens_per_doc``), a text longer than that is not: it is cut
    and split as an unknown text is (a word piece is at least one character, so only texts of more characters are
    counted)."""
    reader = backend.reader
    if reader is None or not reader.text_shards or not texts:
        return [None] * len(texts)
    hits = [None if hit is None else hit[0] for hit in reader.find_texts([_digest(x) for x in texts])]
    longer = [
        i for i, hit in enumerate(hits) if hit and max_pieces is not None and len(texts[i]) > max_pieces
    ]
    if longer:
        pieces = backend.ranker._text().all_pieces([texts[i] for i in longer])
        for i, p in zip(longer, pieces, strict=True):
            if len(p) > max_pieces:
                hits[i] = None
    return hits


def text_features(
    backend,
    qs,
    qvec: np.ndarray | None,
    texts: list[str],
    clock,
    work,
    max_passages: int | None = None,
    dense_for: list[bool] | None = None,
) -> Generator[None, None, tuple[list[float], np.ndarray | None, int, np.ndarray | None]]:
    """Neural scores (and, with a dense query vector, dense cosines) of ``texts`` for one query: stored texts
    from the store (a document stored as passages: by its first ``max_passages``), the others from the cache or
    encoded online; yields before each chunk (the model thread's turns) and checks ``work`` there. ``dense_for``:
    which texts need a cosine (default all; a passage of a longer text does not: :func:`whole_text_cosines`).
    Returns (scores in input order, cosines or None (NaN where not asked for), tokens, the stored texts' best
    sentence windows' cosines where the priors weigh them and ``--ad-hoc-windows`` is on, NaN for the others
    (:func:`window_cosines_online`), or None)."""
    settings, ranker, cache = backend.settings, backend.ranker, backend.text_cache
    t = time.perf_counter()
    digests = [_digest(x) for x in texts]
    wanted = {d for d, on in zip(digests, dense_for or [True] * len(texts), strict=True) if on}
    first: dict[bytes, int] = {}
    for i, d in enumerate(digests):
        first.setdefault(d, i)
    unique = list(first)
    stored: dict[bytes, tuple[str, int]] = {}
    if backend.reader is not None and backend.reader.text_shards:
        stored = {d: hit for d, hit in zip(unique, backend.reader.find_texts(unique), strict=True) if hit}
    fp = ranker.fingerprint
    cached: dict[bytes, Encoded] = {}
    for d in unique:
        if d not in stored:
            entry = cache.get((d, fp))
            if entry is not None:
                cached[d] = entry
    missing = sorted(
        (d for d in unique if d not in stored and d not in cached), key=lambda d: len(texts[first[d]])
    )
    clock.seconds["fetch"] += time.perf_counter() - t
    for source, n in zip(SOURCES, (len(stored), len(cached), len(missing)), strict=True):
        cache.count(source, n)

    neural: dict[bytes, float] = {}
    cosine: dict[bytes, float] = {}
    tokens: dict[bytes, int] = {d: n for d, (_, n) in stored.items()}
    batch, step = settings.batch_size, settings.doc_batch_size
    stored_ids = [stored[d][0] for d in unique if d in stored]
    by_docid = {docid: d for d, (docid, _) in stored.items()}
    stored_dense = qvec is not None and backend.stored_dense_on(False)
    # the window prior for every text or none (--ad-hoc-windows), so a text scores the same in any request
    windows_on = qvec is not None and backend.scorer.windows is not None and settings.ad_hoc_windows
    stored_windows = stored_dense and windows_on
    best: dict[bytes, float] = {}
    hits = list(cached)
    work.chunks_total = math.ceil(len(stored_ids) / batch) + math.ceil(len(hits) / batch)
    work.chunks_total += math.ceil(len(missing) / step)

    # 1. texts the store holds: the docid path's own chunks (fetch, score, stored dense cosines)
    for begin in range(0, len(stored_ids), batch):
        yield  # another request's turn (services/turns.py)
        work.check()
        dense: dict[str, float] = {}
        window: dict[str, float] | None = {} if stored_windows else None
        ids = stored_ids[begin : begin + batch]
        chunk = backend._score_chunk(
            qs, ids, clock.seconds, qvec if stored_dense else None, dense, max_passages, window
        )
        for docid, s in chunk:
            neural[by_docid[docid]] = s
        cosine.update({by_docid[docid]: c for docid, c in dense.items()})
        best.update({by_docid[docid]: c for docid, c in (window or {}).items()})
        if qvec is not None and not stored_dense:  # a store without its dense field: embedded online
            t = time.perf_counter()
            cos = backend.scorer.text_dense(qvec, [texts[first[by_docid[d]]] for d in ids])
            cosine.update(zip((by_docid[d] for d in ids), cos.tolist(), strict=True))
            clock.seconds["encode"] += time.perf_counter() - t
        work.chunks_done += 1

    # 2. texts encoded before: their cached fields (and dense vectors)
    for begin in range(0, len(hits), batch):
        yield
        work.check()
        chunk = hits[begin : begin + batch]
        t = time.perf_counter()
        out = score_encoded(ranker, qs, [cached[d] for d in chunk])
        clock.seconds["score"] += time.perf_counter() - t
        neural.update(zip(chunk, (float(s) for s in out), strict=True))
        tokens.update((d, cached[d].tokens) for d in chunk)
        need = [d for d in chunk if d in wanted] if qvec is not None else []
        if need:
            grown = _dense_of(backend, [cached[d] for d in need], [texts[first[d]] for d in need], clock)
            for i in grown:  # accounted with their dense vectors now
                cache.put((need[i], fp), cached[need[i]])
            cosine.update((d, float(cached[d].dense @ qvec)) for d in need)
        work.chunks_done += 1

    # 3. the rest: encoded online, length-sorted, then cached
    for begin in range(0, len(missing), step):
        yield
        work.check()
        chunk = missing[begin : begin + step]
        t = time.perf_counter()
        entries = [Encoded.of(f) for f in ranker.encode_documents([texts[first[d]] for d in chunk], step)]
        t1 = time.perf_counter()
        out = score_encoded(ranker, qs, entries)
        clock.seconds["encode"] += t1 - t
        clock.seconds["score"] += time.perf_counter() - t1
        neural.update(zip(chunk, (float(s) for s in out), strict=True))
        tokens.update((d, e.tokens) for d, e in zip(chunk, entries, strict=True))
        need = [k for k, d in enumerate(chunk) if d in wanted] if qvec is not None else []
        if need:
            _dense_of(backend, [entries[k] for k in need], [texts[first[chunk[k]]] for k in need], clock)
            cosine.update((chunk[k], float(entries[k].dense @ qvec)) for k in need)
        for d, e in zip(chunk, entries, strict=True):
            cache.put((d, fp), e)
        work.chunks_done += 1

    scores = [neural[d] for d in digests]
    dense_out = None
    if qvec is not None:
        dense_out = np.array([cosine.get(d, math.nan) for d in digests], dtype=np.float64)
    windows_out = None
    if windows_on:
        windows_out = np.array([best.get(d, math.nan) for d in digests], dtype=np.float64)
    return scores, dense_out, sum(tokens[d] for d in digests), windows_out


def window_cosines_online(
    backend, qvec: np.ndarray, texts: list[str], dense: np.ndarray, clock, work
) -> Generator[None, None, np.ndarray]:
    """Each text's best sentence window's cosine with the query: the ``window`` prior of a text the store does not
    hold, cut as the store's windows are (:func:`~aheadrank.indexer.pseudo_queries.stored_windows`, the store's
    sentences per window; an ad-hoc text has no title), the largest over them; a text that is one window gets
    ``dense``, its whole-text cosine (as :func:`aheadrank.rerank.window_cosines`). The windows are embedded
    ``WINDOWS_PER_DOC_BATCH`` × ``--doc-batch-size`` at a time, yielding before each chunk (the model thread's
    turns) and checking ``work`` there. Their embeddings are kept in the text cache (an empty entry for a text of
    one window), so a text sent again is not cut or embedded again."""
    from aheadrank.indexer.pseudo_queries import stored_windows

    size = int(backend.scorer.windows.record["sentences"])
    cache = backend.text_cache
    fp = f"windows{size}:" + backend.scorer.priors.dense["fingerprint"]
    keys = [(_digest(x), fp) for x in texts]
    entries = [cache.get(k) for k in keys]
    todo = [i for i, e in enumerate(entries) if e is None]
    if todo:
        t = time.perf_counter()
        cut = {i: stored_windows("", texts[i], size) for i in todo}
        flat = [w for i in todo for w in cut[i]]
        clock.seconds["encode"] += time.perf_counter() - t
        vectors = yield from _embed_in_turns(backend, flat, WINDOWS_PER_DOC_BATCH, clock, work)
        start = 0
        for i in todo:
            n = len(cut[i])
            rows = vectors[start : start + n] if n else np.zeros((0, len(qvec)), dtype=np.float32)
            entries[i] = Encoded({}, np.array(rows, dtype=np.float32))
            cache.put(keys[i], entries[i])
            start += n
    out = np.asarray(dense, dtype=np.float64).copy()
    for i, e in enumerate(entries):
        if len(e.dense):
            out[i] = float((e.dense @ qvec).max())
    return out


def whole_text_cosines(
    backend, qvec: np.ndarray, texts: list[str], clock, work
) -> Generator[None, None, np.ndarray]:
    """Dense cosines of whole texts longer than the ranker's window, as the store's dense field holds one
    per document (the dense encoder reads a text's head, up to its own length): embedded ``--doc-batch-size`` at a
    time, yielding before each chunk (the model thread's turns) and checking ``work`` there; kept in the text
    cache under the dense encoder's fingerprint, so a text sent again is not embedded again."""
    cache = backend.text_cache
    fp = "dense:" + backend.scorer.priors.dense["fingerprint"]
    t = time.perf_counter()
    keys = [(_digest(x), fp) for x in texts]
    entries = [cache.get(k) or Encoded({}) for k in keys]
    todo = [i for i, e in enumerate(entries) if e.dense is None]
    clock.seconds["fetch"] += time.perf_counter() - t
    vectors = yield from _embed_in_turns(backend, [texts[i] for i in todo], 1, clock, work)
    for i, v in zip(todo, vectors, strict=True):
        entries[i].dense = np.array(v, dtype=np.float32)
        cache.put(keys[i], entries[i])
    return np.array([float(e.dense @ qvec) for e in entries], dtype=np.float64)


def _embed_in_turns(
    backend, texts: list[str], per_doc_batch: int, clock, work
) -> Generator[None, None, np.ndarray]:
    """The dense encoder's unit vectors of ``texts`` (in their order), ``per_doc_batch`` × ``--doc-batch-size``
    texts per chunk, longest first: a turn for the other requests (and a check of ``work``) before each, as the
    ranker's own chunks have."""
    step = backend.settings.doc_batch_size * per_doc_batch
    # longest first, as the encoder orders one batch: texts of like length share a chunk (less padding)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out: list[np.ndarray] = [None] * len(texts)  # type: ignore[list-item]
    work.chunks_total += math.ceil(len(texts) / step)
    for begin in range(0, len(texts), step):
        yield  # another request's turn (services/turns.py)
        work.check()
        t = time.perf_counter()
        idx = order[begin : begin + step]
        for i, v in zip(idx, backend.scorer.encoder().encode_documents([texts[i] for i in idx]), strict=True):
            out[i] = v
        clock.seconds["encode"] += time.perf_counter() - t
        work.chunks_done += 1
    return np.stack(out) if out else np.zeros((0, 0), dtype=np.float32)


def _dense_of(backend, entries: list[Encoded], texts: list[str], clock) -> list[int]:
    """Fill in the dense embeddings the entries lack (one batch through the dense encoder); returns which."""
    todo = [i for i, e in enumerate(entries) if e.dense is None]
    if not todo:
        return todo
    t = time.perf_counter()
    vectors = backend.scorer.encoder().encode_documents([texts[i] for i in todo])
    for i, v in zip(todo, vectors, strict=True):
        entries[i].dense = np.array(v, dtype=np.float32)
    clock.seconds["encode"] += time.perf_counter() - t
    return todo
