"""Durable file operations of the store: fsync, commit of a written shard, the sweep of temp files (the atomic
write itself, its temp names, the directory sync and the checksums ``sha256_file`` and ``sha256_fd`` live in
:mod:`aheadrank.fsfaults`)."""

from __future__ import annotations

import os
from pathlib import Path

from aheadrank.fsfaults import TMP_SUFFIX, fsync_dir


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


def remove_temp_files(directory: Path) -> list[Path]:
    """Delete leftover temp files of an interrupted writer (``.*.tmp``); returns what was removed."""
    removed = []
    for tmp in directory.glob(f".*{TMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed
