"""``verify_store``: every check a store can fail, as a list of problems (empty when it is sound)."""

from __future__ import annotations

from pathlib import Path

from aheadrank.store._io import sha256_file
from aheadrank.store.manifest import read_manifest
from aheadrank.store.shard import read_shard_meta

from aheadrank.errors import StoreError


def verify_store(path: str | Path, allow_incomplete: bool = False) -> list[str]:
    """Check the manifest and every shard (presence, size, sha256, layout); each problem names its file.

    An interrupted (incomplete) store is a problem unless ``allow_incomplete``; its finished shards are
    checked either way.
    """
    directory = Path(path)
    try:
        manifest = read_manifest(directory)
    except StoreError as exc:
        return [str(exc)]
    problems = []
    if not manifest.complete and not allow_incomplete:
        problems.append(
            f"the store is incomplete: its build was interrupted after {manifest.n_docs} documents; resume it"
        )
    for info in manifest.shards:
        file = directory / info.file
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
    return problems
