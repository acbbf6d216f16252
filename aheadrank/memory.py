"""A build stage's memory: its peak resident memory and its peak anonymous memory (Linux ``/proc``).

Resident memory (``VmHWM``) counts every page the process has in memory, the pages of files it maps included:
a stage that scores candidates through a memory-mapped store shows the store's pages it touched, page cache the
kernel reclaims when another process needs the memory. Anonymous memory (``RssAnon``: the heap, tensors, thread
stacks, the JVM's heap) is what the process allocated itself, what a machine has to hold. Linux keeps a peak of
the first (started over by :func:`reset_peak_rss`) but not of the second, so :class:`StageMemory` samples it
from a background thread: its peak is a lower bound, blind to a spike shorter than the sampling interval.
"""

from __future__ import annotations

import threading

SAMPLE_S = 0.05  # the anonymous memory's sampling interval
FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def proc_status(pid: int | str = "self", names: tuple[str, ...] = FIELDS) -> dict[str, int] | None:
    """The named fields of a process's ``/proc/<pid>/status`` (kB); None once it is gone, or off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in names:
            out[name] = int(value.split()[0])
    return out


def reset_peak_rss() -> bool:
    """Start this process's peak resident memory over (Linux: ``/proc/self/clear_refs``), so that the next
    :func:`peak_rss_mb` is one stage's; False where the system has no such reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> int | None:
    """This process's peak resident memory since :func:`reset_peak_rss` (MB; ``VmHWM``), None off Linux. Child
    processes (the Dask workers of a distributed build) are not counted."""
    kb = (proc_status(names=("VmHWM",)) or {}).get("VmHWM")
    return None if kb is None else round(kb / 1024)


def anon_mb() -> int | None:
    """This process's anonymous resident memory now (MB; ``RssAnon``), None off Linux."""
    kb = (proc_status(names=("RssAnon",)) or {}).get("RssAnon")
    return None if kb is None else round(kb / 1024)


class StageMemory:
    """``with StageMemory() as m: ...`` then ``m.record()``: ``{"peak_rss_mb", "peak_anon_mb"}`` of the block
    (each left out where ``/proc`` cannot say). Starts the resident peak over on entry (:func:`reset_peak_rss`)
    and samples the anonymous memory every ``interval`` seconds until exit, and once more at each end."""

    def __init__(self, interval: float = SAMPLE_S):
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.interval = interval
        self.peak_anon: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rss: int | None = None

    def _sample(self) -> None:
        now = anon_mb()
        if now is not None and (self.peak_anon is None or now > self.peak_anon):
            self.peak_anon = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> StageMemory:
        reset_peak_rss()
        self._sample()
        if self.peak_anon is not None:  # nothing to sample off Linux
            self._thread = threading.Thread(target=self._run, name="stage-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        self._rss = peak_rss_mb()

    def record(self) -> dict[str, int]:
        """What the block used: ``peak_rss_mb`` (resident, mapped files' pages included) and ``peak_anon_mb``
        (anonymous, sampled), each where known."""
        out = {}
        if self._rss is not None:
            out["peak_rss_mb"] = self._rss
        if self.peak_anon is not None:
            out["peak_anon_mb"] = self.peak_anon
        return out
