"""The service's native-memory bounds: oneDNN's primitive cache capacity and the periodic heap trim."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import pytest
from aheadrank.services import memory
from aheadrank.services.memory import HeapTrimmer, bound_onednn_cache


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_trimmer_trims_at_most_once_per_interval(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_glibc_trim", lambda: calls.append)
    clock = FakeClock()
    t = HeapTrimmer(10.0, clock=clock)
    assert t.enabled and not t.due() and t.maybe_trim() is None and calls == []  # not before the interval
    clock.now += 9.9
    assert t.maybe_trim() is None and calls == []
    clock.now += 0.1
    assert t.due()
    spent = t.maybe_trim()
    assert spent is not None and spent >= 0 and calls == [0] and t.trims == 1
    assert not t.due() and t.maybe_trim() is None and calls == [0]  # the interval starts again
    clock.now += 10
    assert t.maybe_trim() is not None and calls == [0, 0] and t.trims == 2


def test_trimmer_off_with_zero_interval_or_without_glibc(monkeypatch):
    off = HeapTrimmer(0.0)
    assert not off.enabled and not off.due() and off.maybe_trim() is None
    monkeypatch.setattr(memory, "_glibc_trim", lambda: None)  # musl, macOS: nothing to call
    clock = FakeClock()
    t = HeapTrimmer(1.0, clock=clock)
    clock.now += 5
    assert not t.enabled and not t.due() and t.maybe_trim() is None
    with pytest.raises(ValueError, match=">= 0"):
        HeapTrimmer(-1.0)


BLOCK = 64 * 1024  # below glibc's mmap threshold: heap blocks


def _fragmented_blocks(n: int):
    """n written heap blocks by libc's malloc, all but the last freed: the freed ones below the kept one cannot
    shrink the heap's top and stay resident until trimmed (what a request's fragmented buffers do). Returns
    (libc, the kept block to free, :func:`memory.malloc_stats` while all n were live)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    blocks = [libc.malloc(BLOCK) for _ in range(n)]
    for b in blocks:
        libc.memset(b, 1, BLOCK)
    stats = memory.malloc_stats()
    for b in blocks[:-1]:
        libc.free(b)
    return libc, blocks[-1], stats


def test_real_trim_gives_freed_pages_back():
    if memory._glibc_trim() is None:
        pytest.skip("no glibc malloc_trim here")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from benchkit import proc_status  # noqa: E402  (the bench helpers, beside the scripts)

    libc, kept, _ = _fragmented_blocks(4000)  # 250 MB
    before = proc_status()["RssAnon"]
    t = HeapTrimmer(1e-9)
    assert t.maybe_trim() is not None
    after = proc_status()["RssAnon"]
    libc.free(kept)
    assert before - after > 100 * 1024, (before, after)  # kB: most of the 250 MB went back


def test_bound_onednn_cache_sets_the_variable(monkeypatch):
    monkeypatch.delenv(memory.ONEDNN_CACHE_VARIABLE, raising=False)
    monkeypatch.delenv("DNNL_PRIMITIVE_CACHE_CAPACITY", raising=False)
    bound_onednn_cache(32)
    assert (
        os.environ[memory.ONEDNN_CACHE_VARIABLE] == "32"
        and os.environ["DNNL_PRIMITIVE_CACHE_CAPACITY"] == "32"
    )
    with pytest.raises(ValueError, match=">= 0"):
        bound_onednn_cache(-1)


def test_malloc_stats_sees_live_and_freed_blocks():
    if memory.malloc_stats() is None:
        pytest.skip("no glibc mallinfo2 here")
    before = memory.malloc_stats()
    libc, kept, live = _fragmented_blocks(800)  # 50 MB
    freed = memory.malloc_stats()
    libc.free(kept)
    assert live["in_use"] - before["in_use"] > 40
    assert live["in_use"] - freed["in_use"] > 40 and freed["free_held"] - live["free_held"] > 40
    assert memory.trim_heap() is True
