"""Serving a store: :class:`StoreReader` maps docid -> (shard, row) once, then gathers padded batches.

Uncompressed shards are memory-mapped side by side into one array per dataset (store/vmap.py): a fetch
builds one [B, T] array of token rows and gathers the whole batch with a single ``np.take`` into the
padded output (no per-document Python loop). Where that mapping is not possible, each shard is mapped on
its own and gathered with one ``np.take`` per shard. zstd shards decompress one frame per document
(zstandard's multi-threaded batch API). The fetch path touches no h5py handle and no shared mutable
state, so concurrent fetches from threads need no lock.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np
from aheadrank.store.manifest import Manifest, read_manifest
from aheadrank.store.quant import byte_table, decode_packed, dequantize_int8
from aheadrank.store.shard import DatasetLoc, ShardMeta, read_shard_meta
from aheadrank.store.spec import StoreSpec
from aheadrank.store.texts import DIGEST_BYTES, TEXT_DIGEST
from aheadrank.store.vmap import Segment, Stitched, stitch

from aheadrank.errors import StoreDamagedError, StoreError
from aheadrank.fsfaults import sha256_fd, sha256_file

if TYPE_CHECKING:
    import torch

_ZSTD_THREADS = max(1, min(4, os.cpu_count() or 1))
_STITCH = True  # map every shard into one array per dataset where the platform allows (store/vmap.py)
_SCRATCH_BYTES = 1 << 20  # per-shard fallback: a window of documents goes through a cache-sized block
_F_SETLEASE, _F_GETLEASE = 1024, 1025  # Linux fcntl commands (not exported by every Python's fcntl)
_LEASE_RELEASE_WAIT_S = 30.0  # a reader holding a broken lease waits this long for fetches in flight
log = logging.getLogger("aheadrank.store")
_WATCHED: weakref.WeakSet = weakref.WeakSet()  # readers whose shards hold file leases (SIGIO tells)
_SIGIO_INSTALLED = [False]


@dataclass
class FetchResult:
    """A padded batch: the known docids in request order; ``unknown`` lists the rest (never zero-filled)."""

    fields: dict[str, np.ndarray]  # each [B, T, dim] float16, zero beyond each document's length
    lengths: np.ndarray  # int64 [B]
    docids: list[str]
    unknown: list[str]

    @property
    def mask(self) -> np.ndarray:
        """bool [B, T]: True at real tokens."""
        width = next(iter(self.fields.values())).shape[1] if self.fields else 0
        return np.arange(width)[None, :] < self.lengths[:, None]

    def __len__(self) -> int:
        return len(self.docids)


@dataclass
class TorchBatch:
    """:class:`FetchResult` as torch tensors on a device, plus the bool mask [B, T]."""

    fields: dict[str, torch.Tensor]
    mask: torch.Tensor
    lengths: torch.Tensor
    docids: list[str]
    unknown: list[str]
    # int8 fields fetched with dequantize=False: fields[name] holds the int8 values, scales[name] the
    # float32 scale of each token [B, T] (0 at padding)
    scales: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.docids)


class _MappedShard:
    """One shard file memory-mapped read-only, with a numpy view per dataset.

    The shard's file stays open (``fd``): before every read the reader compares its size and mtime with
    what they were at open (:meth:`changed`), so a file truncated or rewritten in place under a running
    reader is refused instead of read (a mapped read past the end of a file is SIGBUS: a dead process).
    """

    def __init__(self, meta: ShardMeta, expected_bytes: int) -> None:
        self.meta = meta
        self.expected_bytes = expected_bytes
        self.leased = False
        self.fd = os.open(meta.file, os.O_RDONLY)
        try:
            self.opened = os.fstat(self.fd)
            if self.opened.st_size != expected_bytes:
                raise StoreError(
                    f"{meta.file.name}: {self.opened.st_size} bytes on disk, the manifest says "
                    f"{expected_bytes} (truncated?)"
                )
            self._mmap = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise
        self.fields = {name: self._view(loc) for name, loc in meta.fields.items()}
        self.scales = {name: self._view(loc) for name, loc in meta.scales.items()}
        self._tables: dict[str, np.ndarray] = {}

    def book_table(self, name: str, bits: int) -> np.ndarray:
        """A codebook field's lookup table (``store.quant.byte_table`` of the shard's codebooks), built once."""
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = byte_table(self.meta.books[name], bits)
        return table

    def changed(self) -> str | None:
        """Why the file may no longer be read through its mapping (None while it is as it was at open)."""
        if self.fd < 0:
            return "closed"
        now = os.fstat(self.fd)
        if now.st_size != self.expected_bytes:
            return f"{now.st_size} bytes on disk now, the manifest says {self.expected_bytes} (truncated?)"
        if now.st_mtime_ns != self.opened.st_mtime_ns:
            return "modified on disk while being served"
        return None

    def _view(self, loc: DatasetLoc) -> np.ndarray:
        count = int(np.prod(loc.shape, dtype=np.int64))
        return np.frombuffer(self._mmap, dtype=loc.dtype, count=count, offset=loc.offset).reshape(loc.shape)

    def close(self) -> None:
        self.fields, self.scales = {}, {}
        try:
            self._mmap.close()
        except BufferError:  # a caller still holds a view; the mapping goes when it does
            pass
        if self.fd >= 0:
            os.close(self.fd)  # also drops a file lease held on it
            self.fd = -1


def _take_rows(
    sources: dict[int, np.ndarray], shard_of: np.ndarray, rows: np.ndarray, tail: tuple
) -> np.ndarray:
    """``out[b, t] = sources[shard_of[b]][rows[b, t]]``: the padded [B, T, *tail] gather of a batch.

    One shard: a single ``np.take`` straight into the output. Several: the batch is walked in request
    order, a window of documents at a time; per shard in the window, one ``np.take`` into a cache-sized
    scratch block, then one document-level copy into the window. The output is written front to back
    (fresh pages fault in order) and nothing is re-ordered in a second pass over memory.
    """
    batch, width = rows.shape
    dtype = next(iter(sources.values())).dtype if sources else np.float16
    out = np.empty((batch, width, *tail), dtype=dtype)
    if len(sources) == 1:
        source = next(iter(sources.values()))
        np.take(source, rows.reshape(-1), axis=0, out=out.reshape(batch * width, *tail), mode="clip")
        return out
    doc_bytes = max(1, width * int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize)
    window = max(1, _SCRATCH_BYTES // doc_bytes)
    scratch = np.empty((min(window, batch) * width, *tail), dtype=dtype)
    for start in range(0, batch, window):
        shards = shard_of[start : start + window]
        order = np.argsort(shards, kind="stable")
        for part in np.split(order, np.flatnonzero(np.diff(shards[order])) + 1):
            block = scratch[: len(part) * width]
            where = part + start
            np.take(sources[int(shards[part[0]])], rows[where].reshape(-1), axis=0, out=block, mode="clip")
            out[where] = block.reshape(len(part), width, *tail)
    return out


def shard_file_problems(path: Path, shards) -> tuple[list[str], list[str]]:
    """(the listed shard files missing from ``path``, one line for each whose size on disk is not the manifest's):
    what opening a store checks before it reads, without a checksum."""
    missing, sizes = [], []
    for info in shards:
        file = path / info.file
        if not file.is_file():
            missing.append(info.file)
        elif (size := file.stat().st_size) != info.bytes:
            sizes.append(f"{info.file}: {size} bytes on disk, the manifest says {info.bytes} (truncated?)")
    return missing, sizes


class StoreReader:
    """Read-only access to a complete store.

    Opening validates the manifest (format version, completeness, fingerprint, shard files and sizes;
    ``verify=True`` also checks every shard's sha256) and loads docids and offsets; the data stay on disk,
    memory-mapped, served from the page cache.
    """

    def __init__(
        self,
        path: str | Path,
        expected_fingerprint: str | None = None,
        verify: bool = False,
        label: str = "",
    ) -> None:
        self.path = Path(path)
        self.label = label  # prefix of the shard names this reader reports (a sub-store's: "dense/")
        self.lease: str | None = None  # after watch(): "held", or why not (a WARNING was logged)
        self.manifest: Manifest = read_manifest(self.path)
        spec = self.manifest.spec
        if not self.manifest.complete:
            raise StoreError(
                f"the store at {self.path} is incomplete: its build was interrupted after "
                f"{self.manifest.n_docs} documents ({len(self.manifest.shards)} finished shards). "
                "Resume the build (re-run the indexer, or StoreWriter(path, spec, resume=True)) to finish it."
            )
        if expected_fingerprint is not None:
            self.check_fingerprint(expected_fingerprint)
        self._check_files(verify)
        self._shards: list[_MappedShard] = []
        self._damaged: dict[int, str] = {}  # shard index -> why it is refused
        self._inflight: Counter = Counter()  # shard index -> fetches reading it now
        self._cond = threading.Condition()
        self._listeners: list[Callable[[str, str], None]] = []
        try:
            for info in self.manifest.shards:
                meta = read_shard_meta(self.path / info.file, spec, expected_index=info.index)
                if (meta.n_docs, meta.n_tokens) != (info.n_docs, info.n_tokens):
                    raise StoreError(
                        f"{info.file}: holds {meta.n_docs} docs / {meta.n_tokens} tokens, "
                        f"the manifest says {info.n_docs} / {info.n_tokens}"
                    )
                self._shards.append(_MappedShard(meta, info.bytes))
            self._build_index()
            self._stitch()
        except BaseException:
            self.close()
            raise

    def check_fingerprint(self, fingerprint: str) -> None:
        """Refuse to serve this store with a checkpoint other than the one that built it."""
        if fingerprint != self.spec.fingerprint:
            raise StoreError(
                f"the store at {self.path} was built by the checkpoint with fingerprint {self.spec.fingerprint}, "
                f"but the checkpoint being served has fingerprint {fingerprint}; "
                "rebuild the store with this checkpoint or serve the checkpoint that built it"
            )

    def _check_files(self, verify: bool) -> None:
        missing, sizes = shard_file_problems(self.path, self.manifest.shards)
        if missing:
            raise StoreError(f"the store at {self.path} is missing shard files: {', '.join(missing)}")
        if sizes:
            raise StoreError(sizes[0])
        for info in self.manifest.shards if verify else ():
            if sha256_file(self.path / info.file) != info.sha256:
                raise StoreError(f"{info.file}: sha256 mismatch; the shard is corrupt (run verify-store)")

    def _stitch(self) -> None:
        """Uncompressed stores: one array per dataset over all shards (store/vmap.py), where possible."""
        self._stitched: dict[tuple[str, str], Stitched] = {}
        if self.spec.compression != "none" or not _STITCH or not self._shards:
            return
        for kind in ("fields", "scales"):
            for name in getattr(self._shards[0].meta, kind):
                locs = [getattr(shard.meta, kind)[name] for shard in self._shards]
                segments = [
                    Segment(shard.meta.file, loc.offset, loc.shape[0])
                    for shard, loc in zip(self._shards, locs, strict=True)
                ]
                stitched = stitch(segments, locs[0].shape[1:], locs[0].dtype)
                if stitched is None:
                    self._stitched.clear()  # all or nothing: one gather path per store
                    return
                self._stitched[kind, name] = stitched

    def _build_index(self) -> None:
        metas = [s.meta for s in self._shards]
        empty_i64 = np.zeros(0, dtype=np.int64)
        self._ids = np.concatenate([m.docids for m in metas]) if metas else np.zeros(0, dtype="S1")
        self._shard_of = np.concatenate(
            [np.full(m.n_docs, i, dtype=np.int32) for i, m in enumerate(metas)] or [empty_i64]
        )
        self._row = np.concatenate([np.arange(m.n_docs, dtype=np.int64) for m in metas] or [empty_i64])
        self._start = np.concatenate([m.offsets[:-1] for m in metas] or [empty_i64])
        self._len = np.concatenate([np.diff(m.offsets) for m in metas] or [empty_i64])
        self._sorter = np.argsort(self._ids, kind="stable")
        ordered = self._ids[self._sorter]
        dup = np.flatnonzero(ordered[1:] == ordered[:-1])
        if dup.size:
            raise StoreError(
                f"the store at {self.path} holds docid {ordered[dup[0]].decode('utf-8')!r} twice"
            )
        self._index_texts(metas)

    def _index_texts(self, metas: list[ShardMeta]) -> None:
        """The text digests of the shards that have them (store/texts.py), sorted once: a request's texts are
        found with one vectorised binary search (:meth:`find_texts`), as docids are."""
        keys, rows = [], []
        first = 0
        for meta in metas:
            if meta.text_digests is not None and meta.text_digest == TEXT_DIGEST:
                keys.append(np.ascontiguousarray(meta.text_digests).view(f"S{DIGEST_BYTES}").reshape(-1))
                rows.append(np.arange(first, first + meta.n_docs, dtype=np.int64))
            first += meta.n_docs
        self.text_shards = len(keys)  # shards whose texts can be looked up (of len(manifest.shards))
        digests = np.concatenate(keys) if keys else np.zeros(0, dtype=f"S{DIGEST_BYTES}")
        order = np.argsort(digests, kind="stable")  # equal texts: the first document in store order
        self._text_keys = digests[order]
        self._text_rows = np.concatenate(rows)[order] if rows else np.zeros(0, dtype=np.int64)

    def find_texts(self, digests: Sequence[bytes]) -> list[tuple[str, int] | None]:
        """For each text digest (``store.texts.text_digest``): ``(docid, tokens)`` of the stored document with
        that text, or None (not in the store, in a shard without digests, or in a refused shard)."""
        n = len(self._text_keys)
        if not digests or n == 0:
            return [None] * len(digests)
        query = np.frombuffer(b"".join(digests), dtype=f"S{DIGEST_BYTES}")
        if len(query) != len(digests):
            raise StoreError(f"text digests are {DIGEST_BYTES} bytes each")
        pos = np.minimum(np.searchsorted(self._text_keys, query), n - 1)
        found = self._text_keys[pos] == query
        rows = self._text_rows[pos]
        damaged = set(self._damaged)
        out: list[tuple[str, int] | None] = []
        for hit, row in zip(found.tolist(), rows.tolist(), strict=True):
            if not hit or int(self._shard_of[row]) in damaged:
                out.append(None)
            else:
                out.append((self._ids[row].decode("utf-8"), int(self._len[row])))
        return out

    # -- damage: shards that changed or broke under a running reader ------------------------------------

    @property
    def damaged(self) -> dict[str, str]:
        """``{shard file: reason}`` for every shard this reader refuses to read (empty while all is well)."""
        return {self._name(i): why for i, why in sorted(self._damaged.items())}

    def _name(self, shard: int) -> str:
        return self.label + self.manifest.shards[shard].file

    def on_damage(self, callback: Callable[[str, str], None]) -> None:
        """Call ``callback(shard file, reason)`` once per shard when it is found damaged (any thread)."""
        self._listeners.append(callback)

    def mark_damaged(self, docids: Sequence[str], reason: str) -> list[str]:
        """Refuse from now on the shards that hold ``docids`` (e.g. they hold non-finite values); returns
        those shards' files."""
        index, known = self._lookup(list(docids))
        shards = sorted({int(s) for s in self._shard_of[index[known]]})
        for s in shards:
            self._mark(s, reason)
        return [self._name(s) for s in shards]

    def check_shards(self) -> dict[str, str]:
        """Compare every shard file with what it was at open (size, mtime); returns :attr:`damaged`."""
        for s, shard in enumerate(self._shards):
            if s not in self._damaged:
                reason = shard.changed()
                if reason:
                    self._mark(s, reason)
        return self.damaged

    def _mark(self, shard: int, reason: str, notify: bool = True) -> None:
        if shard in self._damaged:
            return
        self._damaged[shard] = reason
        if notify:
            self._notify(shard)

    def _notify(self, shard: int) -> None:
        file, reason = self._name(shard), self._damaged[shard]
        log.error("store %s: shard %s is refused from now on: %s", self.path.name, file, reason)
        for callback in self._listeners:
            try:
                callback(file, reason)
            except Exception:  # a listener never breaks the read path
                log.exception("store damage listener failed")

    def _enter(self, shards: list[int]) -> None:
        """Count a fetch as reading ``shards``, after checking that each may still be read."""
        with self._cond:
            self._inflight.update(shards)
        try:
            bad = []
            for s in shards:
                if s not in self._damaged:
                    reason = self._shards[s].changed()
                    if reason:
                        self._mark(s, reason)
                if s in self._damaged:
                    bad.append(s)
            if bad:
                files = [self._name(s) for s in bad]
                reasons = "; ".join(f"{f}: {self._damaged[s]}" for f, s in zip(files, bad, strict=True))
                raise StoreDamagedError(
                    f"the store at {self.path.name} cannot serve these documents: damaged shard(s) {reasons}. "
                    "Restore or rebuild the shard (aheadrank verify-store, then aheadrank index to resume), "
                    "then restart the server",
                    files,
                )
        except BaseException:
            self._leave(shards)
            raise

    def _leave(self, shards: list[int]) -> None:
        with self._cond:
            self._inflight.subtract(shards)
            self._cond.notify_all()

    def watch(self) -> bool:
        """Take a read lease on every shard file (Linux; the main thread only): the kernel then signals this
        process (SIGIO) before another process may open a shard for writing or truncate it, and holds that
        process back until the reader lets go. The shard is refused from then on and its lease released
        once no fetch reads it: no read can race the truncation. True if every shard is leased."""
        if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
            return False
        import fcntl

        _install_sigio()
        _WATCHED.add(self)
        failed: list[tuple[str, OSError]] = []
        for shard in self._shards:
            try:
                fcntl.fcntl(shard.fd, _F_SETLEASE, fcntl.F_RDLCK)
                shard.leased = True
            except OSError as exc:  # not the file's owner, a filesystem without leases, ...
                failed.append((shard.meta.file.name, exc))
        self.lease = "held"
        if failed:
            name, exc = failed[0]
            self.lease = (
                f"no file lease on {len(failed)} of {len(self._shards)} shard(s) of {self.label or self.path.name} "
                f"({name}: {exc.strerror or exc}): a shard opened for writing while served is found by its "
                "size/mtime only, and one rewritten with its mtime restored only by a verification (--verify-store)"
            )
            log.warning("store %s: %s", self.path.name, self.lease)
        return not failed

    def verify_shard(self, shard: int, on_bytes: Callable[[int], None] | None = None) -> str | None:
        """Check the sha256 of shard ``shard`` as this reader serves it (read through its open file, so a file
        replaced by a rename is not what gets checked); a mismatch refuses the shard from now on, like any
        damage. Returns why it is refused (None when it verifies, or is refused already)."""
        if shard in self._damaged or not self._shards:
            return self._damaged.get(shard)
        info = self.manifest.shards[shard]
        mapped = self._shards[shard]
        if mapped.fd < 0:
            return None
        digest = sha256_fd(mapped.fd, info.bytes, on_bytes=on_bytes)
        if digest != info.sha256:
            self._mark(
                shard,
                f"sha256 mismatch (manifest {info.sha256[:16]}..., file {digest[:16]}...): its bytes changed "
                "since it was written",
            )
        return self._damaged.get(shard)

    def _lease_broken(self) -> None:
        """SIGIO (main thread): find the shards whose lease is being broken, refuse them, release later."""
        import fcntl

        broken = []
        for s, shard in enumerate(self._shards):
            if not shard.leased or shard.fd < 0:
                continue
            try:
                state = fcntl.fcntl(shard.fd, _F_GETLEASE)
            except OSError:
                continue
            if state != fcntl.F_RDLCK:
                shard.leased = False
                if s not in self._damaged:
                    self._mark(s, "opened for writing or truncated by another process while served", False)
                    broken.append(s)
                else:
                    broken.append(-1 - s)  # released, not announced twice
        if broken:  # no locks or logging in a signal handler: a thread waits for the reads, then lets go
            threading.Thread(target=self._release, args=(broken,), daemon=True, name="store-lease").start()

    def _release(self, shards: list[int]) -> None:
        import fcntl

        shards_ = [s if s >= 0 else -1 - s for s in shards]
        with self._cond:
            self._cond.wait_for(lambda: all(self._inflight[s] <= 0 for s in shards_), _LEASE_RELEASE_WAIT_S)
        for s, announce in zip(shards_, shards, strict=True):
            try:
                fcntl.fcntl(self._shards[s].fd, _F_SETLEASE, fcntl.F_UNLCK)
            except (OSError, IndexError):
                pass
            if announce >= 0:
                self._notify(s)

    # -- lookup -------------------------------------------------------------------------------------

    @property
    def spec(self) -> StoreSpec:
        return self.manifest.spec

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, docid: object) -> bool:
        return isinstance(docid, str) and bool(self._lookup([docid])[1][0])

    def known(self, docids: Sequence[str]) -> np.ndarray:
        """bool [n]: which of ``docids`` the store holds (one vectorised lookup)."""
        return self._lookup(list(docids))[1]

    def same_docids(self, other: StoreReader) -> bool:
        """Whether ``other`` holds the same docids in the same order (e.g. a sub-store and its store)."""
        return np.array_equal(self._ids, other._ids)

    def docids(self) -> list[str]:
        """All docids in store order (shard by shard)."""
        return [d.decode("utf-8") for d in self._ids.tolist()]

    def _lookup(self, docids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(global document index [n] (valid where known), known bool [n]) for ``docids``."""
        n = len(docids)
        if n == 0 or len(self._ids) == 0:
            return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        if set(map(type, docids)) != {str}:
            bad = next(d for d in docids if type(d) is not str)
            raise StoreError(f"docids must be strings, got {bad!r}")
        # The query array is as wide as the longest *stored* docid, never as the longest asked for: a docid
        # longer than every stored one is unknown without being encoded or widened (one long docid among
        # many short ones must not size an array of them all). NUL: never stored, and numpy's bytes would
        # drop a trailing one. Lone surrogates (valid in JSON) encode to bytes no stored docid holds.
        width = self._ids.dtype.itemsize
        encoded = [
            d.encode("utf-8", "surrogatepass") if len(d) <= width and "\x00" not in d else None
            for d in docids
        ]
        plain = np.fromiter((e is not None and len(e) <= width for e in encoded), dtype=bool, count=n)
        query = np.array([e if ok else b"" for e, ok in zip(encoded, plain, strict=True)], dtype=f"S{width}")
        pos = np.searchsorted(self._ids, query, sorter=self._sorter)
        index = self._sorter[np.minimum(pos, len(self._ids) - 1)]
        known = (self._ids[index] == query) & plain
        return index, known

    # -- fetch --------------------------------------------------------------------------------------

    def _resolve(
        self, docids: Sequence[str], pad_to: int | None
    ) -> tuple[np.ndarray, np.ndarray, int, list, list]:
        """(global index, lengths, padded width, known docids, unknown docids) of a request."""
        if isinstance(docids, str):
            raise StoreError("fetch() takes a list of docids, not one string")
        if not self._shards and len(self._ids):
            raise StoreError(f"the reader of {self.path} is closed")
        docids = list(docids)
        index, known = self._lookup(docids)
        if known.all():
            found, unknown = docids, []
        else:
            found = [docids[i] for i in np.flatnonzero(known)]
            unknown = [docids[i] for i in np.flatnonzero(~known)]
            index = index[known]
        lengths = self._len[index].astype(np.int64)
        width = int(lengths.max()) if len(lengths) else 0
        if pad_to is not None:
            if isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < width:
                raise StoreError(
                    f"pad_to={pad_to!r} is shorter than the longest fetched document ({width} tokens)"
                )
            width = pad_to
        return index, lengths, width, found, unknown

    def fetch(self, docids: Sequence[str], pad_to: int | None = None) -> FetchResult:
        """Gather the stored fields of ``docids`` into [B, T, dim] float16 arrays, in request order.

        ``T`` is the longest document of the batch, or ``pad_to`` (an error if a document is longer).
        Docids not in the store are listed in ``unknown`` and left out of the batch.
        """
        index, lengths, width, found, unknown = self._resolve(docids, pad_to)
        raw = self._gather(index, lengths, width)
        fields = {name: v if s is None else dequantize_int8(v, s) for name, (v, s) in raw.items()}
        return FetchResult(fields, lengths, found, unknown)

    def _gather(
        self, index: np.ndarray, lengths: np.ndarray, width: int
    ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Per field: values [B, T, dim] as stored (float16 or int8) and, for int8, scales [B, T] (0 at padding)."""
        shard_of = self._shard_of[index]
        touched = [int(s) for s in np.unique(shard_of)]
        self._enter(touched)
        try:
            return self._gather_checked(index, lengths, width, shard_of)
        finally:
            self._leave(touched)

    def _gather_checked(
        self, index: np.ndarray, lengths: np.ndarray, width: int, shard_of: np.ndarray
    ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        spec = self.spec
        # the batch's positions grouped by shard: one gather (or decompression call) per shard touched
        order = np.argsort(shard_of, kind="stable")
        cuts = np.flatnonzero(np.diff(shard_of[order])) + 1
        groups = [(int(shard_of[g[0]]), g) for g in np.split(order, cuts) if len(g)]
        positions = np.arange(width)
        pad = positions[None, :] >= lengths[:, None]  # [B, T]
        # token rows inside each document's shard; padding re-reads the document's last row, zeroed below
        last = np.maximum(lengths - 1, 0)[:, None]
        rows = self._start[index][:, None] + np.minimum(positions[None, :], last)
        out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for name, dim in spec.fields.items():
            if spec.book_bits is not None:
                values = self._decode_books(name, self._take("fields", name, groups, shard_of, rows), groups)
            elif spec.compression == "none":
                values = self._take("fields", name, groups, shard_of, rows)
            else:
                values = self._decompress(name, groups, index, lengths, width, dim)
            scales = None
            if spec.dtype == "int8":
                scales = self._take("scales", name, groups, shard_of, rows)
                scales[pad] = 0  # zero scale -> zero vector, whatever int8 values sit in the padding
            elif spec.compression == "none" and pad.any():
                values[pad] = 0
            out[name] = (values, scales)
        return out

    def _take(
        self,
        kind: str,
        name: str,
        groups: list[tuple[int, np.ndarray]],
        shard_of: np.ndarray,
        rows: np.ndarray,
    ) -> np.ndarray:
        """The [B, T, *row] gather of ``kind/name``: one ``np.take`` over the stitched shards, else per shard."""
        stitched = self._stitched.get((kind, name))
        if stitched is None:
            sources = {s: getattr(self._shards[s], kind)[name] for s, _ in groups}
            tail = next(iter(sources.values())).shape[1:] if sources else ()
            return _take_rows(sources, shard_of, rows, tail)
        batch, width = rows.shape
        tail = stitched.array.shape[1:]
        out = np.empty((batch, width, *tail), dtype=stitched.array.dtype)
        global_rows = rows + stitched.row_start[shard_of][:, None]
        np.take(
            stitched.array,
            global_rows.reshape(-1),
            axis=0,
            out=out.reshape(batch * width, *tail),
            mode="clip",
        )
        return out

    def _decode_books(
        self, name: str, packed: np.ndarray, groups: list[tuple[int, np.ndarray]]
    ) -> np.ndarray:
        """A codebook field's packed codes [B, T, dim·bits/8] -> float16 [B, T, dim], each document through its own
        shard's codebooks."""
        bits = self.spec.book_bits
        if len(groups) == 1:
            return decode_packed(packed, self._shards[groups[0][0]].book_table(name, bits))
        out = np.empty((*packed.shape[:-1], self.spec.fields[name]), np.float16)
        for shard, where in groups:
            out[where] = decode_packed(packed[where], self._shards[shard].book_table(name, bits))
        return out

    def _decompress(
        self,
        name: str,
        groups: list[tuple[int, np.ndarray]],
        index: np.ndarray,
        lengths: np.ndarray,
        width: int,
        dim: int,
    ) -> np.ndarray:
        """zstd: one frame per document, decompressed (multi-threaded) into a zeroed [B, T, dim] array."""
        import zstandard

        dtype = np.int8 if self.spec.dtype == "int8" else np.float16
        out = np.zeros((len(index), width, dim), dtype=dtype)
        itemsize = np.dtype(dtype).itemsize
        decompressor = zstandard.ZstdDecompressor()
        for shard, where in groups:
            blob = self._shards[shard].fields[name]
            blob_offsets = self._shards[shard].meta.blob_offsets[name]
            rows = self._row[index[where]]
            segments = np.stack([blob_offsets[rows], blob_offsets[rows + 1] - blob_offsets[rows]], axis=1)
            sizes = (lengths[where] * dim * itemsize).astype(np.uint64)
            frames = zstandard.BufferWithSegments(blob, segments.astype(np.uint64).tobytes())
            try:
                result = decompressor.multi_decompress_to_buffer(
                    frames, decompressed_sizes=sizes.tobytes(), threads=_ZSTD_THREADS
                )
            except zstandard.ZstdError as exc:
                raise StoreError(
                    f"{self._shards[shard].meta.file.name}: corrupt zstd data in {name!r} ({exc})"
                ) from exc
            for i, position in enumerate(where.tolist()):  # per document: zstd frames are not vectorisable
                out[position, : lengths[position]] = np.frombuffer(result[i], dtype=dtype).reshape(-1, dim)
        return out

    def fetch_torch(
        self,
        docids: Sequence[str],
        device: str | torch.device = "cpu",
        pad_to: int | None = None,
        dequantize: bool = True,
    ) -> TorchBatch:
        """:meth:`fetch` as torch tensors on ``device``, plus the bool mask [B, T].

        For CUDA, host arrays are pinned and copied with ``non_blocking=True``; int8 stores travel as int8
        plus scales (half the bytes) and are dequantized to float16 on the device. With
        ``dequantize=False`` an int8 field comes back as stored: its int8 values in ``fields`` and its
        per-token scales in ``scales`` (the rerank core scores from them without a dequantised copy).
        """
        import torch

        target = torch.device(device)
        cuda = target.type == "cuda"

        def move(array: np.ndarray) -> torch.Tensor:
            tensor = torch.from_numpy(array)
            return tensor.pin_memory().to(target, non_blocking=True) if cuda else tensor.to(target)

        index, lengths, width, found, unknown = self._resolve(docids, pad_to)
        fields, quantized = {}, {}
        for name, (values, scales) in self._gather(index, lengths, width).items():
            if scales is None:
                fields[name] = move(values)
            elif not dequantize:
                fields[name], quantized[name] = move(values), move(scales)
            elif cuda:
                fields[name] = (move(values).float() * move(scales).unsqueeze(-1)).half()
            else:
                fields[name] = torch.from_numpy(dequantize_int8(values, scales))
        lengths_t = move(lengths)
        mask = torch.arange(width, device=target)[None, :] < lengths_t[:, None]
        return TorchBatch(fields, mask, lengths_t, found, unknown, quantized)

    # -- lifetime -----------------------------------------------------------------------------------

    def close(self) -> None:
        _WATCHED.discard(self)
        for shard in getattr(self, "_shards", []):
            shard.close()
        self._shards = []
        self._stitched = {}  # unmapped once no fetch still uses them

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        spec = self.spec
        return (
            f"StoreReader({str(self.path)!r}, docs={len(self)}, fields={spec.fields}, "
            f"compression={spec.compression!r}, dtype={spec.dtype!r})"
        )


def _install_sigio() -> None:
    """One SIGIO handler per process for every watching reader (SIGIO's default action kills)."""
    if _SIGIO_INSTALLED[0]:
        return
    previous = signal.getsignal(signal.SIGIO)

    def on_sigio(signum: int, frame: object) -> None:
        for reader in list(_WATCHED):
            reader._lease_broken()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGIO, on_sigio)
    _SIGIO_INSTALLED[0] = True
