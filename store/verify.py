"""``verify_store``: every check a store can fail, as a list of problems (empty when it is sound), its
sub-store ``dense/`` included; :class:`ShardVerification`: the sha256 of every shard of open readers, as
served, at start or in the background (``aheadrank serve --verify-store``); :func:`verify_before_reading`: the
same for a batch job (``rerank-run``, ``fit-priors``)."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from aheadrank.store.manifest import (
    DENSE_DIR,
    MANIFEST_NAME,
    SHARD_PREFIX,
    Manifest,
    ShardInfo,
    collection_mismatch,
    read_manifest,
)
from aheadrank.store.shard import ShardMeta, read_shard_meta
from aheadrank.store.texts import TEXT_DIGEST, text_digests

from aheadrank.errors import StoreError
from aheadrank.fsfaults import sha256_file

if TYPE_CHECKING:
    from aheadrank.store.reader import StoreReader

log = logging.getLogger("aheadrank.store")
VERIFY_MODES = ("off", "start", "background")


def verify_store(
    path: str | Path,
    allow_incomplete: bool = False,
    substores: bool = True,
    texts: Iterable[tuple[str, str]] | None = None,
) -> list[str]:
    """Check the manifest and every shard (presence, size, sha256, layout); each problem names its file.

    An interrupted (incomplete) store is a problem unless ``allow_incomplete``; its finished shards are
    checked either way. With ``substores``, the dense field (``dense/``) is checked the same way (its
    problems name ``dense/…``), and so are what binds it to the store: present and complete when the store
    was built with it, the same collection as the store. A shard's text digests (``text_sha256``) must be
    there exactly when the manifest says so; with ``texts`` (the ``(docid, text)`` pairs of the collection
    the store was built from, in its order), each document's docid and text digest are checked against it.
    """
    directory = Path(path)
    try:
        manifest = read_manifest(directory)
    except StoreError as exc:
        return [str(exc)]
    problems = []
    pairs = iter(texts) if texts is not None else None
    if not manifest.complete and not allow_incomplete:
        problems.append(
            f"the store is incomplete: its build was interrupted after {manifest.n_docs} documents; resume it"
        )
    for info in manifest.shards:
        file = directory / info.file
        expected = list(itertools.islice(pairs, info.n_docs)) if pairs is not None else None
        if not file.is_file():
            problems.append(f"{info.file}: missing")
            continue
        size = file.stat().st_size
        if size != info.bytes:
            problems.append(f"{info.file}: {size} bytes on disk, the manifest says {info.bytes}")
            continue
        digest = sha256_file(file)
        if digest != info.sha256:
            problems.append(
                f"{info.file}: sha256 mismatch (manifest {info.sha256[:16]}..., file {digest[:16]}...)"
            )
            continue
        try:
            meta = read_shard_meta(file, manifest.spec, expected_index=info.index)
        except StoreError as exc:
            problems.append(str(exc))
            continue
        if (meta.n_docs, meta.n_tokens) != (info.n_docs, info.n_tokens):
            problems.append(
                f"{info.file}: holds {meta.n_docs} docs / {meta.n_tokens} tokens, the manifest disagrees"
            )
        problems += _check_texts(info, meta, expected)
    if pairs is not None and next(pairs, None) is not None:
        problems.append(f"the collection holds more documents than the store ({manifest.n_docs})")
    if substores:
        problems += _verify_dense(directory, manifest, allow_incomplete)
        problems += _verify_passages(directory, manifest, allow_incomplete)
        problems += _verify_windows(directory, manifest, allow_incomplete)
    return problems


def _check_texts(info: ShardInfo, meta: ShardMeta, expected: list[tuple[str, str]] | None) -> list[str]:
    """A shard's text digests against the manifest's entry and, with ``expected`` (its ``(docid, text)``
    pairs from the collection), against each document's text."""
    if meta.text_digest != info.text_digest:
        return [
            f"{info.file}: text digests {meta.text_digest or 'absent'} in the file, "
            f"{info.text_digest or 'absent'} in the manifest"
        ]
    if expected is None:
        return []
    docids = [d.decode("utf-8") for d in meta.docids.tolist()]
    if [d for d, _ in expected] != docids:
        at = next((i for i, (a, (b, _)) in enumerate(zip(docids, expected, strict=False)) if a != b), None)
        where = (
            f"the store holds {docids[at]!r} where the collection has {expected[at][0]!r}"
            if at is not None
            else f"the store holds {len(docids)} documents there, the collection {len(expected)}"
        )
        return [f"{info.file}: not built from this collection ({where})"]
    if meta.text_digests is None or meta.text_digest != TEXT_DIGEST:
        return []
    wrong = np.flatnonzero((meta.text_digests != text_digests(t for _, t in expected)).any(axis=1))
    if not wrong.size:
        return []
    return [
        f"{info.file}: {wrong.size} document(s) whose stored text digest is not their text's in the collection "
        f"(e.g. {[docids[i] for i in wrong[:3]]}): a wrong digest would serve another text's fields; rebuild "
        "the store (`aheadrank index --overwrite`)"
    ]


def _verify_sub(
    directory: Path, name: str, required: bool, what: str, manifest: Manifest, allow_incomplete: bool
) -> tuple[list[str], Manifest | None]:
    """A sub-store's problems (named ``name/…``) and its manifest (None when missing or unreadable); missing is
    a problem when the store was built with it (``required``: ``what``, e.g. "the dense field")."""
    sub = directory / name
    if not (sub / MANIFEST_NAME).is_file():
        if required and (manifest.complete or not allow_incomplete):
            return [
                f"{name}/: missing, but the store was built with {what} (its build was interrupted?): re-run "
                "`aheadrank index` with the same flags to resume it"
            ], None
        return [], None
    problems = [
        f"{name}/{p}" if p.startswith(SHARD_PREFIX) else f"{name}/: {p}"
        for p in verify_store(sub, allow_incomplete, substores=False)
    ]
    try:
        return problems, read_manifest(sub)
    except StoreError:
        return problems, None  # already reported


def _verify_dense(directory: Path, manifest: Manifest, allow_incomplete: bool) -> list[str]:
    problems, dense = _verify_sub(
        directory, DENSE_DIR, bool(manifest.dense), "the dense field", manifest, allow_incomplete
    )
    if dense is None:
        return problems
    why = collection_mismatch(manifest, dense, f"{DENSE_DIR}/")
    if why is None and manifest.complete and dense.complete and manifest.n_docs != dense.n_docs:
        why = f"{DENSE_DIR}/ holds {dense.n_docs} documents, the store {manifest.n_docs}"
    return problems + ([why] if why else [])


def _verify_passages(directory: Path, manifest: Manifest, allow_incomplete: bool) -> list[str]:
    """``passages/`` (store/passages.py): present and complete when the store records passages, every shard
    sound, bound to the store (checkpoint, split, collection), its entries ``<docid>#p<k>`` in order and of
    documents the store holds."""
    from aheadrank.store.passages import PASSAGES_DIR, binding_problem

    if manifest.passages is None:
        return []
    return _verify_parts(
        directory, manifest, allow_incomplete, PASSAGES_DIR, "--passages", "passages", binding_problem
    )


def _verify_windows(directory: Path, manifest: Manifest, allow_incomplete: bool) -> list[str]:
    """``windows/`` (store/windows.py): as ``passages/``, bound by the cut and the collection (the dense
    encoder that wrote it is checked where it is served, against the priors')."""
    from aheadrank.store.windows import WINDOWS_DIR, binding_problem

    if manifest.windows is None:
        return []
    return _verify_parts(
        directory, manifest, allow_incomplete, WINDOWS_DIR, "sentence windows", "windows", binding_problem
    )


def _verify_parts(
    directory: Path, manifest: Manifest, allow_incomplete: bool, name: str, what: str, parts: str, binding
) -> list[str]:
    """A sub-store of a document's parts (``<docid>#p<k>``: passages, windows): present and complete, every
    shard sound, ``binding(manifest, sub)`` None, its entries in order and of documents the store holds."""
    from aheadrank.store.passages import passage_counts

    sub = directory / name
    problems, found = _verify_sub(directory, name, True, what, manifest, allow_incomplete)
    if found is None:
        return problems
    why = binding(manifest, found)
    if why:
        return [*problems, why]
    pids: list[str] = []
    for info in found.shards:
        try:
            meta = read_shard_meta(sub / info.file, found.spec, expected_index=info.index)
        except StoreError:
            return problems  # already reported
        pids += [d.decode("utf-8") for d in meta.docids.tolist()]
    try:
        owners = set(passage_counts(pids))
    except StoreError as exc:
        return [*problems, f"{name}/: {exc}"]
    ids: set[str] = set()
    for info in manifest.shards:
        try:
            meta = read_shard_meta(directory / info.file, manifest.spec, expected_index=info.index)
        except StoreError:
            return problems  # already reported
        ids.update(d.decode("utf-8") for d in meta.docids.tolist())
    absent = sorted(owners - ids)
    if absent:
        problems.append(
            f"{name}/ holds {parts} of {len(absent)} document(s) the store does not ({absent[:3]})"
        )
    return problems


class ShardVerification:
    """The sha256 of every shard of open readers, checked as served (through each reader's open files), one
    shard after another; a mismatch refuses that shard from then on (``StoreReader.verify_shard``).

    :meth:`run` checks them now; :meth:`start` in a daemon thread at the lowest CPU priority (hashing releases
    the GIL, so requests keep their cores first). :meth:`status` says how far it got, for /ready and /v1/info.
    """

    def __init__(self, readers: Sequence[StoreReader | None], mode: str = "start") -> None:
        if mode not in VERIFY_MODES:
            raise StoreError(f"unknown store verification mode {mode!r} (one of {', '.join(VERIFY_MODES)})")
        self.readers = [r for r in readers if r is not None]
        self.mode = mode
        self.state = "off" if mode == "off" else "pending"  # -> running -> verified | failed | stopped
        self.bytes_total = sum(r.manifest.n_bytes for r in self.readers)
        self.shards_total = sum(len(r.manifest.shards) for r in self.readers)
        self.bytes_done = 0
        self.shards_done = 0
        self.failed: dict[str, str] = {}
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> dict[str, str]:
        """Verify every shard now; returns ``{shard: reason}`` for those refused (empty when all verify)."""
        self.state = "running"
        t0 = time.perf_counter()

        def add(n: int) -> None:
            self.bytes_done += n
            self.seconds = time.perf_counter() - t0

        for reader in self.readers:
            for s, info in enumerate(reader.manifest.shards):
                if self._stop.is_set():
                    self.state = "stopped"
                    return dict(self.failed)
                before = self.bytes_done
                why = reader.verify_shard(s, on_bytes=add)
                if why:
                    self.failed[reader.label + info.file] = why
                self.bytes_done = before + info.bytes
                self.shards_done += 1
        self.seconds = time.perf_counter() - t0
        self.state = "failed" if self.failed else "verified"
        log.log(
            logging.ERROR if self.failed else logging.INFO,
            "store verification %s: %d shards, %.1f MB in %.1f s%s",
            self.state,
            self.shards_done,
            self.bytes_done / 1e6,
            self.seconds,
            "; refused: " + ", ".join(self.failed) if self.failed else "",
        )
        return dict(self.failed)

    def start(self) -> None:
        """Verify in the background (a daemon thread at the lowest CPU priority)."""
        if self.mode == "off" or self._thread is not None:
            return

        def work() -> None:
            try:  # Linux: a thread is a task of its own, so this lowers only the verifier's priority
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except (AttributeError, OSError):
                pass
            try:
                self.run()
            except Exception as exc:  # a reader closed under it (shutting down), an I/O error...
                self.state = "stopped"
                log.warning("store verification stopped: %s", exc)

        self._thread = threading.Thread(target=work, daemon=True, name="store-verify")
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """True once a background verification has finished (or none runs)."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def refused_line(self) -> str:
        """The shards refused and why, in one line (``shard: reason; ...``)."""
        return "; ".join(f"{file}: {why}" for file, why in self.failed.items())

    def status(self) -> dict[str, Any]:
        seconds = self.seconds
        return {
            "mode": self.mode,
            "state": self.state,
            "shards_done": self.shards_done,
            "shards_total": self.shards_total,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "seconds": round(seconds, 3),
            "mb_per_s": round(self.bytes_done / seconds / 1e6, 1) if seconds > 0 else None,
            "refused": dict(self.failed),
        }


def verify_before_reading(
    readers: Sequence[StoreReader | None], mode: str = "start"
) -> dict[str, Any] | None:
    """A batch job's ``--verify-store`` (``rerank-run``, ``fit-priors``): ``start`` checks the sha256 of every shard
    of ``readers`` before anything is read from them, and a mismatch raises StoreError naming the shards (the job
    writes nothing); ``background`` is read as ``start`` (a batch job has nothing to overlap the check with);
    ``off`` checks nothing (the reader's size checks and the non-finite score check still hold). Returns the
    verification's :meth:`ShardVerification.status`, or None when off."""
    verification = ShardVerification(readers, mode)  # an unknown mode is refused here
    if mode == "off":
        return None
    if verification.run():
        raise StoreError(
            f"the store {verification.readers[0].path} does not verify: {verification.refused_line()}. Nothing was "
            "scored; restore the shards or rebuild them (`aheadrank index` resumes), or run `aheadrank verify-store` "
            "for every check"
        )
    return verification.status()
