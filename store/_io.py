"""Durable file operations of the store: fsync, commit of a written shard, checksums, the sweep of temp files
(the atomic write itself, its temp names, the directory sync and ``sha256_file`` live in :mod:`aheadrank.fsfaults`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from aheadrank.fsfaults import TMP_SUFFIX, fsync_dir

_CHUNK = 8 << 20


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_file(tmp: Path, final: Path) -> None:
    """fsync ``tmp``, rename it over ``final`` atomically, fsync the directory."""
    fsync_file(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def sha256_fd(fd: int, size: int, chunk: int = _CHUNK, on_bytes=None) -> str:
    """sha256 of the first ``size`` bytes of an open file, read with ``pread`` (no file position, so it works on
    a descriptor others use; a file cut short hashes what is left). ``on_bytes(n)`` after every block."""
    digest = hashlib.sha256()
    offset = 0
    while offset < size:
        block = os.pread(fd, min(chunk, size - offset), offset)
        if not block:
            break
        digest.update(block)  # releases the GIL: a verifying thread leaves the others to run
        offset += len(block)
        if on_bytes is not None:
            on_bytes(len(block))
    return digest.hexdigest()


def remove_temp_files(directory: Path) -> list[Path]:
    """Delete leftover temp files of an interrupted writer (``.*.tmp``); returns what was removed."""
    removed = []
    for tmp in directory.glob(f".*{TMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed
