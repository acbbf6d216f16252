"""One numpy array over the same dataset of every shard: the shards' file ranges mapped side by side.

A candidate batch spans many shards; with one memory map per shard, the gather needs one ``np.take`` per
shard touched, which for a large store (hundreds of shards) is a Python call per document. Instead, an
address range is reserved (``PROT_NONE``) and each shard's dataset bytes are mapped into it
(``MAP_FIXED``, read-only, shared with the page cache) at offsets that are multiples of both the page
size and the row size. One array then covers every shard, shard ``s`` starting at row ``row_start[s]``,
and a whole batch is one ``np.take``. The gaps between shards stay ``PROT_NONE`` and are never indexed.

Needs POSIX ``mmap`` through ctypes (Linux, macOS) and page-aligned datasets (shards are written with
HDF5 alignment of 4096); :func:`stitch` returns None where either is missing and the reader falls back
to one map per shard. The mapping is released when the last array using it is garbage-collected, so a
fetch running while the reader closes never touches unmapped memory.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAGE = mmap.PAGESIZE
_MAP_FIXED = 0x10  # the same value on Linux and macOS
_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform in ("linux", "darwin") and hasattr(mmap, "MAP_ANONYMOUS"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int64,
        ]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = libc
    return _libc


@dataclass(frozen=True)
class Segment:
    """``rows`` rows of one shard's dataset, stored at ``offset`` in ``file``."""

    file: Path
    offset: int
    rows: int


@dataclass
class Stitched:
    array: np.ndarray  # [total_rows, *row_shape]; only the rows of the segments may be read
    row_start: np.ndarray  # int64 [n_segments]: the first row of each segment in ``array``


def _unmap(address: int, size: int) -> None:
    libc = _c()
    if libc is not None:
        libc.munmap(address, size)


def stitch(segments: list[Segment], row_shape: tuple[int, ...], dtype: np.dtype) -> Stitched | None:
    """Map ``segments`` into one array, or None where that is not possible here."""
    libc = _c()
    dtype = np.dtype(dtype)
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    if libc is None or not segments or row_bytes == 0 or any(s.offset % PAGE for s in segments):
        return None
    step = math.lcm(PAGE, row_bytes)  # segment starts: page-aligned and a whole number of rows
    starts, size = [], 0
    for segment in segments:
        starts.append(size)
        size += -(-max(segment.rows * row_bytes, 1) // step) * step
    failed = ctypes.c_void_p(-1).value
    base = libc.mmap(None, size, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # reserve, PROT_NONE
    if base in (None, failed):
        return None
    try:
        for segment, start in zip(segments, starts, strict=True):
            length = segment.rows * row_bytes
            if length == 0:
                continue
            fd = os.open(segment.file, os.O_RDONLY)
            try:
                got = libc.mmap(
                    base + start, length, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, segment.offset
                )
            finally:
                os.close(fd)
            if got != base + start:
                raise OSError(ctypes.get_errno(), f"mmap of {segment.file} failed")
    except OSError:
        libc.munmap(base, size)
        return None
    buffer = (ctypes.c_char * size).from_address(base)
    weakref.finalize(buffer, _unmap, base, size)  # unmapped when the last view of it is gone
    array = np.frombuffer(buffer, dtype=dtype).reshape(-1, *row_shape)
    array.flags.writeable = False  # the pages are read-only: a write would be a segfault, not an error
    return Stitched(array, np.asarray(starts, dtype=np.int64) // row_bytes)
