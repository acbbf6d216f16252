"""Building a store, the one write and resume path: :class:`StoreWriter` (one process, documents in order),
or :func:`prepare_build` + :func:`~store.shard.write_shard` + :func:`write_manifest` (shards encoded anywhere,
finished in any order: the indexer's local and Dask builds). Both start the same way: a killed run's temp
files are removed, a shard file the manifest does not list is deleted, and an existing store is continued
only when it was written with the same spec."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from aheadrank.store._io import remove_temp_files
from aheadrank.store.manifest import (
    MANIFEST_NAME,
    SHARD_PREFIX,
    SHARD_SUFFIX,
    Manifest,
    ShardInfo,
    check_shard_sequence,
    read_manifest,
    write_manifest_file,
)
from aheadrank.store.shard import ShardBuffer, read_shard_meta, validate_docid
from aheadrank.store.spec import StoreSpec
from aheadrank.store.texts import text_digest

from aheadrank.errors import StoreError

log = logging.getLogger("aheadrank.store")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _remove_shards_not_in(directory: Path, keep: Sequence[ShardInfo]) -> None:
    """A shard file the manifest does not list does not exist: delete such leftovers of an earlier run."""
    kept = {info.file for info in keep}
    for file in directory.glob(f"{SHARD_PREFIX}*{SHARD_SUFFIX}"):
        if file.name not in kept:
            file.unlink(missing_ok=True)


def prepare_build(
    path: str | Path,
    spec: StoreSpec,
    overwrite: bool = False,
    keep: Sequence[str] = (),
    owned: Sequence[str] = (),
) -> dict[int, ShardInfo]:
    """Open ``path`` for a shard-by-shard build with ``spec``; return the finished shards to keep {index: info}.

        A store built by another checkpoint or with other options (``config``, the provenance, aside) is refused;
        a listed shard that is gone or cut short is deleted and rebuilt. ``overwrite`` deletes an existing store
        (the manifest first: from then on the old store does not exist) and refuses a directory holding files
        that are not a store's: ``owned`` names the store's other entries (sub-stores, deleted with it), ``keep``
    entries to leave alone (the build's lock)."""
    path = Path(path)
    if overwrite and path.exists():
        foreign = [
            p.name
            for p in path.iterdir()
            if p.name not in (MANIFEST_NAME, *keep, *owned) and not p.name.startswith((SHARD_PREFIX, "."))
        ]
        if foreign:  # never delete a directory that is not a store
            raise StoreError(
                f"--overwrite refused: {path} holds files that are not a store's ({foreign[:3]})"
            )
        (path / MANIFEST_NAME).unlink(missing_ok=True)
        for child in path.iterdir():
            if child.name not in keep:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    path.mkdir(parents=True, exist_ok=True)
    for tmp in remove_temp_files(path):  # a killed run's half-written shard or manifest
        log.info("removed %s, left by an interrupted build", tmp.name)
    if not (path / MANIFEST_NAME).exists():
        _remove_shards_not_in(path, [])
        return {}
    manifest = read_manifest(path)
    old = manifest.spec
    if old.fingerprint != spec.fingerprint:
        raise StoreError(
            f"store {path} was built by checkpoint {old.fingerprint[:12]}, not {spec.fingerprint[:12]}; "
            "pass --overwrite to start over"
        )
    diffs = spec.differences(old, ignore=("config",))
    if diffs:
        raise StoreError(
            f"store {path} was built with other options ({'; '.join(diffs)}: requested != stored); "
            "pass --overwrite"
        )
    kept = {}
    for info in manifest.shards:  # a listed shard that is gone or cut short is rebuilt, not trusted
        file = path / info.file
        size = file.stat().st_size if file.is_file() else None
        if size != info.bytes:
            log.warning(
                "%s is %s; it is rebuilt",
                info.file,
                "missing" if size is None else f"{size} bytes, not {info.bytes}",
            )
            file.unlink(missing_ok=True)
            continue
        kept[info.index] = info
    return kept


class StoreWriter:
    """Append documents in order; shard i holds documents [i*shard_size, (i+1)*shard_size).

    Each full shard is written to a temp file, fsynced, renamed into place, and the manifest is rewritten
    atomically with ``"complete": false``; :meth:`close` writes the last (partial) shard and the manifest
    with ``"complete": true``. A crash at any moment leaves a consistent, resumable store.

    ``resume=True`` on an interrupted store built with the same spec keeps its finished shards;
    :attr:`num_done` says how many documents (the first ``num_done`` of the collection) are already stored,
    so the caller skips them. ``resume=False`` deletes an existing store at ``path`` and starts over.
    Leaving the ``with`` block by an exception keeps the finished shards and leaves the store incomplete.
    """

    def __init__(self, path: str | Path, spec: StoreSpec, resume: bool = True) -> None:
        if not isinstance(spec, StoreSpec):
            raise StoreError(f"spec must be a StoreSpec, got {type(spec).__name__}")
        self.path = Path(path)
        self.spec = spec
        self.path.mkdir(parents=True, exist_ok=True)
        remove_temp_files(self.path)
        self._shards: list[ShardInfo] = []
        self._seen: set[str] = set()
        self._created = _now()
        self._complete = False
        self._closed = False
        if (self.path / MANIFEST_NAME).exists():
            if resume:
                self._resume()
            else:
                (self.path / MANIFEST_NAME).unlink()  # first: from here on the old store does not exist
        _remove_shards_not_in(self.path, self._shards)
        self._buffer = ShardBuffer(spec)

    def _resume(self) -> None:
        manifest = read_manifest(self.path)
        self.spec.check_compatible(manifest.spec, where=f"the store at {self.path}")
        self._created = manifest.created or self._created
        self._complete = manifest.complete
        for position, info in enumerate(manifest.shards):
            file = self.path / info.file
            usable = info.index == position and info.n_docs == self.spec.shard_size
            if not self._complete and (not usable or not file.is_file() or file.stat().st_size != info.bytes):
                break  # this writer appends in order: keep the prefix of finished shards, rebuild the rest
            meta = read_shard_meta(file, self.spec, expected_index=info.index)
            ids = [d.decode("utf-8") for d in meta.docids.tolist()]
            if len(ids) != info.n_docs:
                raise StoreError(f"{info.file}: {len(ids)} documents, the manifest says {info.n_docs}")
            self._seen.update(ids)
            self._shards.append(info)
        if len(self._shards) < len(manifest.shards):  # forget the broken tail before deleting its files
            self._write_manifest(complete=False)

    @property
    def num_done(self) -> int:
        """Documents already stored in finished shards (skip this many when resuming)."""
        return sum(info.n_docs for info in self._shards)

    @property
    def num_added(self) -> int:
        """Documents stored or buffered so far, ``num_done`` included."""
        return self.num_done + len(self._buffer)

    @property
    def shards(self) -> list[ShardInfo]:
        return list(self._shards)

    def add(self, docid: str, fields: Mapping[str, Any], text: str | None = None) -> None:
        """Append one document: ``fields`` maps each spec field to a [doc_len, dim] float array or tensor;
        ``text`` (the text the fields were encoded from) stores its digest (store/texts.py), so the service can
        look the text up: give it for every document of a shard or for none."""
        if self._closed:
            raise StoreError("the writer is closed")
        if self._complete:
            raise StoreError(f"the store at {self.path} is complete; open it with resume=False to rebuild it")
        validate_docid(docid)
        if docid in self._seen:
            raise StoreError(f"duplicate docid {docid!r}: already in the store")
        self._buffer.add(docid, fields, None if text is None else text_digest(text))
        self._seen.add(docid)
        if len(self._buffer) >= self.spec.shard_size:
            self._finish_shard()
            self._write_manifest(complete=False)

    def add_many(
        self,
        docids: Sequence[str],
        field_dicts: Sequence[Mapping[str, Any]],
        texts: Sequence[str] | None = None,
    ) -> None:
        if len(docids) != len(field_dicts) or (texts is not None and len(texts) != len(docids)):
            raise StoreError(f"{len(docids)} docids but {len(field_dicts)} field dicts (and texts)")
        for i, (docid, fields) in enumerate(zip(docids, field_dicts, strict=True)):
            self.add(docid, fields, None if texts is None else texts[i])

    def _finish_shard(self) -> None:
        self._shards.append(self._buffer.write(self.path, len(self._shards)))
        self._buffer = ShardBuffer(self.spec)

    def _write_manifest(self, complete: bool) -> None:
        manifest = Manifest(self.spec, self._shards, complete, created=self._created)
        write_manifest_file(self.path, manifest)

    def close(self) -> None:
        """Write the last shard and mark the store complete."""
        if self._closed:
            return
        if len(self._buffer):
            self._finish_shard()
        if not self._complete:
            self._write_manifest(complete=True)
            self._complete = True
        self._closed = True

    def abort(self) -> None:
        """Drop buffered documents; the finished shards stay, the store stays incomplete (resumable)."""
        self._buffer = ShardBuffer(self.spec)
        self._closed = True

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_manifest(
    path: str | Path,
    spec: StoreSpec,
    shard_infos: Sequence[ShardInfo],
    complete: bool = True,
    collection: dict[str, Any] | None = None,
    dense: bool | None = None,
    passages: dict[str, Any] | None = None,
) -> Manifest:
    """Merge shards written by :func:`~store.shard.write_shard` into a store (atomically, written last).

    Checks that the shards are numbered 0..n-1, that every shard but the last is full, that each file is
    present with the recorded size and matches the spec, and (when ``complete``) that no docid repeats.
    """
    directory = Path(path)
    shards = sorted(shard_infos, key=lambda info: info.index)
    check_shard_sequence(spec, shards, complete)
    all_ids = []
    for info in shards:
        file = directory / info.file
        if not file.is_file():
            raise StoreError(f"shard file {info.file} is missing from {directory}")
        if file.stat().st_size != info.bytes:
            raise StoreError(f"{info.file}: {file.stat().st_size} bytes on disk, {info.bytes} recorded")
        if complete:
            meta = read_shard_meta(file, spec, expected_index=info.index)
            if (meta.n_docs, meta.n_tokens) != (info.n_docs, info.n_tokens):
                raise StoreError(
                    f"{info.file}: holds {meta.n_docs} docs / {meta.n_tokens} tokens, recorded otherwise"
                )
            all_ids.append(meta.docids)
    if all_ids:
        ids = np.sort(np.concatenate(all_ids))
        dup = np.flatnonzero(ids[1:] == ids[:-1])
        if dup.size:
            raise StoreError(f"duplicate docid {ids[dup[0]].decode('utf-8')!r} in more than one shard")
    try:
        old = read_manifest(directory)
        previous, dense = old.created, old.dense if dense is None else dense  # kept unless given
        passages = old.passages if passages is None else passages
        windows = old.windows  # recorded by aheadrank.indexer.build.build_windows, kept on every rewrite
    except StoreError:
        previous, windows = "", None
    manifest = Manifest(
        spec,
        list(shards),
        complete,
        created=previous or _now(),
        collection=collection or {},
        dense=dense,
        passages=passages,
        windows=windows,
    )
    write_manifest_file(directory, manifest)
    return manifest
