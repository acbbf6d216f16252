"""Long documents stored as passages (``aheadrank index --passages``): the sub-store ``passages/``.

A document longer than the ranker's window is split at index time as the service splits an ad-hoc text
(aheadrank/passages.py ``split_passages``, the same window, overlap and passage cap), and each passage is
stored as an entry of its own in ``<store>/passages/``, a store in the ordinary format (manifest last, atomic
shards, sha256, resume, leases). The store's own entry for the document stays as it was (its first window),
so everything that does not know about passages (the dense field, text digests, BM25) is unchanged.

The passage entries' docids say which document they belong to: ``<docid>#p<k>``, k = 0, 1, ... in document
order (:func:`passage_docid`). They live only in ``passages/``, so they can never collide with the store's
docids, and since the suffix is always ``#p`` and digits, the last ``#p`` of an entry's docid separates it: a
docid that itself contains ``#p`` (``a#p1`` -> ``a#p1#p0``) still works. The passages of one document are
consecutive entries; :func:`passage_counts` checks that when a reader opens the sub-store.

What the passages were split with is recorded twice: in the store's manifest (``"passages": {"window",
"overlap", "max_passages"}``, written before the passage build starts: a store whose ``passages/`` is then
missing or incomplete is refused, never served as if it had none) and in ``passages/``'s own ``config``
(the same, plus ``collection``: the sha256 of the store's collection), which binds the sub-store to its store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aheadrank.errors import StoreError

PASSAGES_DIR = "passages"
SEPARATOR = "#p"
RECORD_KEYS = ("window", "overlap", "max_passages")


def passage_docid(docid: str, k: int) -> str:
    """The docid of passage ``k`` (from 0) of document ``docid`` in ``passages/``."""
    return f"{docid}{SEPARATOR}{k}"


def split_passage_docid(pid: str) -> tuple[str, int]:
    """(document docid, passage number) of a ``passages/`` entry; a StoreError for a docid not of that form."""
    head, sep, tail = pid.rpartition(SEPARATOR)
    if not sep or not head or not tail.isdigit() or (len(tail) > 1 and tail[0] == "0"):
        raise StoreError(f"{pid!r} is not a passage docid (<docid>{SEPARATOR}<k>)")
    return head, int(tail)


def passage_counts(pids: Iterable[str]) -> dict[str, int]:
    """{document docid: passages} from ``passages/``'s docids in store order; each document's passages must be
    consecutive and numbered 0, 1, ... (a StoreError names the first entry that is not)."""
    counts: dict[str, int] = {}
    last = None
    for pid in pids:
        docid, k = split_passage_docid(pid)
        expected = counts.get(docid, 0) if docid == last else 0
        if k != expected or (docid != last and docid in counts):
            raise StoreError(
                f"passage entry {pid!r} is out of order (expected {passage_docid(docid, expected)})"
            )
        counts[docid] = k + 1
        last = docid
    return counts


def passage_record(window: int, overlap: int, max_passages: int | None) -> dict[str, Any]:
    """What the passages were split with (recorded in the manifests): window and overlap in word pieces."""
    return {"window": int(window), "overlap": int(overlap), "max_passages": max_passages}


@dataclass
class StoredPassages:
    """An open ``passages/``: its reader, each long document's number of passages, and the record."""

    reader: Any  # StoreReader of passages/ (label "passages/")
    counts: dict[str, int]
    record: dict[str, Any]

    @property
    def window(self) -> int:
        return int(self.record["window"])

    @property
    def overlap(self) -> int:
        return int(self.record["overlap"])

    @property
    def max_passages(self) -> int | None:
        return self.record.get("max_passages")

    def expand(self, docids: Sequence[str], max_passages: int | None = None) -> dict[str, list[str]]:
        """{docid: its passage docids, at most ``max_passages`` (the first ones)} for the given docids stored
        as passages; the others are not in it."""
        out = {}
        for d in docids:
            n = self.counts.get(d)
            if n:
                n = n if max_passages is None else min(n, max_passages)
                out[d] = [passage_docid(d, k) for k in range(n)]
        return out

    def mark_damaged(self, docids: Sequence[str], reason: str) -> list[str]:
        """Refuse the ``passages/`` shards holding the passages of ``docids``; returns their names."""
        pids = [p for ps in self.expand(docids).values() for p in ps]
        return self.reader.mark_damaged(pids, reason) if pids else []

    def close(self) -> None:
        self.reader.close()


def open_passages(store: str | Path, main_reader=None) -> StoredPassages | None:
    """The store's passages (``<store>/passages``), checked against the store: None when it was built without
    ``--passages``; a StoreError, never a silent serve of first windows, when it was built with them and
    ``passages/`` is missing or incomplete, written by another checkpoint, split otherwise than the store
    records, or built from another collection."""
    from aheadrank.store.manifest import read_manifest

    main = main_reader.manifest if main_reader is not None else read_manifest(store)
    if main.passages is None:
        return None
    sub_dir = Path(store) / PASSAGES_DIR
    sub = whole_sub(store, sub_dir, "--passages", "aheadrank index")
    why = binding_problem(main, sub)
    if why:
        raise StoreError(
            f"refusing the store {store}: {why}. Rebuild it: `aheadrank index --passages --overwrite`"
        )
    reader, counts = open_parts(
        store, sub_dir, main_reader, "passages", "Rebuild it: `aheadrank index --passages --overwrite`"
    )
    return StoredPassages(reader, counts, dict(main.passages))


def whole_sub(store, sub_dir: Path, built_with: str, command: str):
    """The manifest of the store's sub-store ``sub_dir``, which the store records it was ``built_with``; a
    StoreError, never a silent serve without it, when it is missing or incomplete (re-run ``command``)."""
    from aheadrank.store.manifest import read_manifest

    resume = f"its build was interrupted: re-run `{command}` with the same flags to resume it"
    if not (sub_dir / "manifest.json").is_file():
        raise StoreError(f"the store {store} was built with {built_with}, but {sub_dir} is missing: {resume}")
    sub = read_manifest(sub_dir)
    if not sub.complete:
        raise StoreError(
            f"the store {store} was built with {built_with}, but {sub_dir} is incomplete: {resume}"
        )
    return sub


def open_parts(store, sub_dir: Path, main_reader, parts: str, rebuild: str):
    """(reader, {docid: entries}) of a sub-store of documents' parts (``<docid>#p<k>``: passages, windows), whose
    entries must be in order and, with ``main_reader``, of documents the store holds (else a StoreError that says
    ``rebuild``)."""
    from aheadrank.store.reader import StoreReader

    reader = StoreReader(sub_dir, label=f"{sub_dir.name}/")
    try:
        counts = passage_counts(reader.docids())
        if main_reader is not None and counts:
            ids = list(counts)
            absent = [d for d, k in zip(ids, main_reader.known(ids), strict=True) if not k]
            if absent:
                raise StoreError(
                    f"refusing the store {store}: {sub_dir} holds {parts} of {len(absent)} document(s) the store "
                    f"does not hold ({absent[:3]}). {rebuild}"
                )
    except BaseException:
        reader.close()
        raise
    return reader, counts


def binding_problem(main, sub) -> str | None:
    """Why ``passages/`` (manifest ``sub``) does not belong to its store (manifest ``main``), or None."""
    recorded = sub.spec.config.get("passages") or {}
    if sub.spec.fingerprint != main.spec.fingerprint:
        return (
            f"{PASSAGES_DIR}/ was written by checkpoint {sub.spec.fingerprint[:12]}, the store by "
            f"{main.spec.fingerprint[:12]}"
        )
    if {k: recorded.get(k) for k in RECORD_KEYS} != {k: main.passages.get(k) for k in RECORD_KEYS}:
        return (
            f"{PASSAGES_DIR}/ was split with { ({k: recorded.get(k) for k in RECORD_KEYS}) }, the store records "
            f"{ ({k: main.passages.get(k) for k in RECORD_KEYS}) }"
        )
    ours = (main.collection or {}).get("sha256")
    if ours and recorded.get("collection") != ours:
        return f"{PASSAGES_DIR}/ was built from another collection than the store"
    return None
