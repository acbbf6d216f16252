"""Keeping a long-running service's native memory bounded.

Measured with ``bench/memory.py`` (the app in-process, 8 closed-loop clients, MORES 2×IB S2 at depth 1,000;
``bench/results/memory-*.json``): the heap grows for two reasons, neither of them Python objects.

* **oneDNN's primitive cache.** Every distinct input shape of a oneDNN linear layer (query length × block of
  candidates × document length) compiles and keeps a primitive, up to 1,024 of them by default. Bounding the
  cache (:func:`bound_onednn_cache`; the service's default, 8 entries) slows the growth of live allocations and
  lowers the heap's peaks; re-creating evicted primitives did not measurably slow requests (TK, MORES).
* **Freed memory the allocator keeps.** glibc keeps freed heap pages (the per-request candidate buffers are
  freed, but fragmented between longer-lived small blocks) instead of giving them back; the held part grows in
  steps with the largest requests seen. :class:`HeapTrimmer` calls ``malloc_trim`` on the model thread after
  a request, at most once per interval, which returns those pages (numbers: ``services/README.md``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time

log = logging.getLogger("aheadrank.service")

ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def bound_onednn_cache(capacity: int) -> None:
    """Set oneDNN's primitive cache capacity for this process. oneDNN reads it once, when it first creates a
    primitive: call this before the model runs (``RerankBackend.load`` does). 0 disables the cache."""
    if capacity < 0:
        raise ValueError(f"the oneDNN primitive cache capacity must be >= 0, got {capacity}")
    os.environ[ONEDNN_CACHE_VARIABLE] = str(capacity)
    os.environ["DNNL_PRIMITIVE_CACHE_CAPACITY"] = str(capacity)  # the name older oneDNN builds read


def _glibc_trim():
    """glibc's ``malloc_trim``, or None (another C library: musl, macOS)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_stats() -> dict[str, float] | None:
    """glibc's own account of this process's heap, over all arenas, MB: ``in_use`` (malloc'd and not freed),
    ``free_held`` (freed but kept by the allocator, not given back to the system), ``mmapped`` (large blocks,
    given back on free). Growth in ``in_use`` is a leak; growth in ``free_held`` with ``in_use`` flat is the
    allocator keeping pages (fragmentation), which ``malloc_trim`` may return. None without glibc ≥ 2.33."""
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    mb = 2**20
    return {
        "in_use": round((m.uordblks + m.hblkhd) / mb, 1),
        "free_held": round(m.fordblks / mb, 1),
        "mmapped": round(m.hblkhd / mb, 1),
    }


def trim_heap() -> bool:
    """One ``malloc_trim(0)`` now (all arenas); False where the C library has none."""
    fn = _glibc_trim()
    if fn is None:
        return False
    fn(0)
    return True


class HeapTrimmer:
    """``malloc_trim(0)`` after a request, at most once per ``interval_s`` seconds (0: never). Where the C
    library has no ``malloc_trim`` it does nothing. Thread-safe; meant to be called on the model thread, after
    a request's work and before the next one starts."""

    def __init__(self, interval_s: float, clock=time.monotonic) -> None:
        if interval_s < 0:
            raise ValueError(f"the heap trim interval must be >= 0 s, got {interval_s}")
        self.interval_s = interval_s
        self.clock = clock
        self._trim = _glibc_trim() if interval_s > 0 else None
        self._lock = threading.Lock()
        self._last = clock()
        self.trims = 0

    @property
    def enabled(self) -> bool:
        return self._trim is not None

    def due(self) -> bool:
        """Whether a trim would run now (enabled, and the interval has passed)."""
        return self._trim is not None and self.clock() - self._last >= self.interval_s

    def maybe_trim(self) -> float | None:
        """Trim if the interval has passed since the last trim; the seconds it took, or None if it did not."""
        with self._lock:
            if not self.due():
                return None
            t = time.perf_counter()
            self._trim(0)
            spent = time.perf_counter() - t
            self._last = self.clock()
            self.trims += 1
        log.debug("malloc_trim took %.1f ms", spent * 1e3)
        return spent
