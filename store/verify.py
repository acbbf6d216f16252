"""``verify_store``: every check a store can fail, as a list of problems (empty when it is sound)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from aheadrank.store._io import sha256_file
from aheadrank.store.manifest import ShardInfo, read_manifest
from aheadrank.store.shard import ShardMeta, read_shard_meta
from aheadrank.store.texts import TEXT_DIGEST, text_digests

from aheadrank.errors import StoreError


def verify_store(
    path: str | Path,
    allow_incomplete: bool = False,
    texts: Iterable[tuple[str, str]] | None = None,
) -> list[str]:
    """Check the manifest and every shard (presence, size, sha256, layout); each problem names its file.

    An interrupted (incomplete) store is a problem unless ``allow_incomplete``; its finished shards are
    checked either way. A shard's text digests (``text_sha256``) must be there exactly when the manifest says
    so; with ``texts`` (the ``(docid, text)`` pairs of the collection the store was built from, in its order),
    each document's docid and text digest are checked against it.
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
