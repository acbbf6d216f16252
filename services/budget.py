"""The latency model behind ``time_budget_ms`` (TK's time-budget idea, measured per ranker and device).

Scoring n stored candidates in chunks of ``batch`` costs ``t(n) = per_chunk·ceil(n / batch) + per_doc·n``
(fetch + score). Warm-up fits both constants on this machine by least squares over a few chunk sizes;
every chunk a request scores updates ``per_doc`` (quick to rise, slow to fall, so a slower machine state
is believed at once). A request re-ranks the head of its candidates chunk by chunk and, before each
chunk, plans again from the time left, so a mis-estimate costs at most one chunk.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence


class LatencyModel:
    def __init__(self, batch: int, per_doc_s: float = 1e-3, per_chunk_s: float = 1e-3, safety: float = 0.9):
        self.batch = batch
        self.per_doc_s = per_doc_s
        self.per_chunk_s = per_chunk_s
        self.safety = safety  # plan for this share of the time left
        self.reserve_s = 0.002  # kept back for building and sending the response
        self._lock = threading.Lock()

    def fit(self, samples: Sequence[tuple[int, float]]) -> None:
        """Least squares of ``seconds = per_chunk + per_doc·n`` over single-chunk samples (n, seconds)."""
        if len(samples) < 2:
            raise ValueError("need at least two (n, seconds) samples")
        xs = [float(n) for n, _ in samples]
        ys = [float(t) for _, t in samples]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else my / mx
        slope = max(slope, 1e-7)
        with self._lock:
            self.per_doc_s = slope
            self.per_chunk_s = max(my - slope * mx, 0.0)

    def predict(self, n: int) -> float:
        return self.per_chunk_s * math.ceil(n / self.batch) + self.per_doc_s * n if n > 0 else 0.0

    def depth_for(self, seconds_left: float, limit: int) -> int:
        """The most candidates (<= limit) whose fetch + score is predicted to fit in ``seconds_left``."""
        usable = seconds_left * self.safety - self.reserve_s
        if usable <= 0 or limit <= 0:
            return 0
        best = 0
        for chunks in range(1, math.ceil(limit / self.batch) + 1):
            room = usable - chunks * self.per_chunk_s
            if room <= 0:
                break
            fit = room / self.per_doc_s  # may be huge (or inf) for a huge budget
            n = min(chunks * self.batch, limit) if fit >= limit else min(chunks * self.batch, int(fit + 1e-9))
            if n <= (chunks - 1) * self.batch:  # this many chunks would not be full enough to need another
                break
            best = max(best, n)
        return best

    def observe(self, n: int, seconds: float) -> None:
        """Update ``per_doc`` from one scored chunk of n candidates."""
        if n <= 0:
            return
        per_doc = max(seconds - self.per_chunk_s, 0.0) / n
        with self._lock:
            alpha = 0.5 if per_doc > self.per_doc_s else 0.1
            self.per_doc_s = max((1 - alpha) * self.per_doc_s + alpha * per_doc, 1e-7)

    def describe(self) -> dict:
        return {
            "per_doc_ms": round(self.per_doc_s * 1e3, 4),
            "per_chunk_ms": round(self.per_chunk_s * 1e3, 4),
            "batch": self.batch,
            "safety": self.safety,
        }
