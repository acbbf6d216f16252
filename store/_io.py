"""Durable file operations: fsync, atomic replace, checksums."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

TMP_SUFFIX = ".tmp"
_CHUNK = 8 << 20


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(final: Path) -> Path:
    """A unique hidden temp file next to ``final``: ``.NAME.<random>.tmp`` (never matched by a reader)."""
    return final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")


def commit_file(tmp: Path, final: Path) -> None:
    """fsync ``tmp``, rename it over ``final`` atomically, fsync the directory."""
    fsync_file(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def atomic_write_bytes(final: Path, data: bytes) -> None:
    tmp = temp_name(final)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


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
