"""aheadrank.memory: a stage's resident peak starts over, and its anonymous peak leaves mapped files out."""

from __future__ import annotations

import mmap
import sys
import time

import numpy as np
import pytest

from aheadrank.memory import StageMemory, anon_mb, peak_rss_mb, reset_peak_rss

linux = pytest.mark.skipif(sys.platform != "linux", reason="memory is read from /proc")
MB = 2**20


def _rss_mb() -> float:
    """This process's resident memory now (MB)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


@linux
def test_a_stage_s_peak_memory_starts_over_when_it_begins():
    assert reset_peak_rss()
    now = _rss_mb()
    block = np.ones(256 * MB, dtype=np.uint8)  # 256 MB touched
    during = peak_rss_mb()
    assert during >= now + 200
    del block  # returned to the system (a block this large is its own mapping)
    assert peak_rss_mb() >= during - 16  # a peak, not the memory in use now (pages freed meanwhile aside)
    assert reset_peak_rss()
    assert peak_rss_mb() <= during - 128  # started over: the 256 MB freed is no longer in it


@linux
def test_an_allocation_freed_inside_the_stage_is_in_its_anonymous_peak():
    before = anon_mb()
    with StageMemory(interval=0.01) as memory:
        block = np.ones(256 * MB, dtype=np.uint8)
        for _ in range(500):  # until the sampler has seen it (bounded: 5 s at most)
            if (memory.peak_anon or 0) >= before + 200:
                break
            time.sleep(0.01)
        del block
    got = memory.record()
    assert got["peak_anon_mb"] >= before + 200, (before, got)
    assert anon_mb() <= got["peak_anon_mb"] - 128  # a peak, not what is left at the end
    assert got["peak_rss_mb"] >= got["peak_anon_mb"]


@linux
def test_a_mapped_file_s_pages_are_resident_but_not_anonymous(tmp_path):
    path = tmp_path / "store.bin"
    path.write_bytes(np.full(256 * MB, 7, dtype=np.uint8).tobytes())
    before = anon_mb()
    with StageMemory() as memory, open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = np.frombuffer(mapped, dtype=np.uint8)
        assert int(view[:: mmap.PAGESIZE].sum()) == 7 * (256 * MB // mmap.PAGESIZE)  # every page touched
        del view
        mapped.close()
    got = memory.record()
    assert got["peak_rss_mb"] >= before + 200, (before, got)  # the file's pages were resident
    assert got["peak_anon_mb"] <= before + 64, (before, got)  # but not allocated by the process


def test_the_sampling_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval"):
        StageMemory(interval=0)
