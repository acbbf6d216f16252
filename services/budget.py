"""The latency model behind ``time_budget_ms`` (TK's time-budget idea, measured per ranker and device).

Scoring n stored candidates in chunks of ``batch`` costs ``t(n) = per_chunk·ceil(n / batch) + per_doc·n``
(fetch + score). Warm-up fits both constants on this machine by least squares over a few chunk sizes (the
fastest of its repeats at each size: a busy moment does not set the model). Every chunk a request scores, with
a budget or without, scales both toward what it cost (quick to rise, half way; slower to fall, a quarter), so a
slower machine state is believed at once and an estimate made on a busy machine falls back. A request re-ranks
the head of its candidates chunk by chunk and, before each chunk, plans again from the time left, so a
mis-estimate costs at most one chunk. Where the model plans nothing for a request with time left and no chunk
has been timed for ``PROBE_AFTER_S``, the request scores one small chunk (``probe_size``) anyway: an estimate
too high to let any chunk run would otherwise never be corrected.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

PROBE_AFTER_S = 30.0  # a budget that plans nothing scores one small chunk if none was timed for this long


class LatencyModel:
    def __init__(self, batch: int, per_doc_s: float = 1e-3, per_chunk_s: float = 1e-3, safety: float = 0.9):
        self.batch = batch
        self.per_doc_s = per_doc_s
        self.per_chunk_s = per_chunk_s
        self.safety = safety  # plan for this share of the time left
        self.reserve_s = 0.002  # kept back for building and sending the response
        self.timed_at = time.monotonic()  # the last fit or observed chunk
        self._lock = threading.Lock()

    def fit(self, samples: Sequence[tuple[int, float]]) -> None:
        """Least squares of ``seconds = per_chunk + per_doc·n`` over single-chunk samples (n, seconds), each size
        at its fastest sample (a repeat slowed by other work on the machine is not the ranker's cost); samples of
        one size alone are fitted as they are."""
        if len(samples) < 2:
            raise ValueError("need at least two (n, seconds) samples")
        fastest: dict[int, float] = {}
        for n, t in samples:
            fastest[n] = min(float(t), fastest.get(n, math.inf))
        pairs = list(fastest.items()) if len(fastest) >= 2 else [(n, float(t)) for n, t in samples]
        xs = [float(n) for n, _ in pairs]
        ys = [t for _, t in pairs]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else my / mx
        slope = max(slope, 1e-7)
        with self._lock:
            self.per_doc_s = slope
            self.per_chunk_s = max(my - slope * mx, 0.0)
            self.timed_at = time.monotonic()

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
        """Scale both constants toward one scored chunk of n candidates that took ``seconds``: half way when it
        was slower than predicted, a quarter of the way when faster."""
        if n <= 0:
            return
        with self._lock:
            predicted = self.per_chunk_s + self.per_doc_s * n
            ratio = seconds / predicted if predicted > 0 else 1.0
            alpha = 0.5 if ratio > 1 else 0.25
            factor = (1 - alpha) + alpha * ratio
            self.per_doc_s = max(self.per_doc_s * factor, 1e-7)
            self.per_chunk_s *= factor
            self.timed_at = time.monotonic()

    def probe_size(self, seconds_left: float, now: float | None = None) -> int:
        """Candidates to score anyway when :meth:`depth_for` plans none: a small chunk (a sixteenth of a batch,
        the smallest warm-up size) where time is left and no chunk was timed for ``PROBE_AFTER_S``; else 0."""
        now = time.monotonic() if now is None else now
        if seconds_left <= 0 or now - self.timed_at < PROBE_AFTER_S:
            return 0
        return max(1, self.batch // 16)

    def describe(self) -> dict:
        return {
            "per_doc_ms": round(self.per_doc_s * 1e3, 4),
            "per_chunk_ms": round(self.per_chunk_s * 1e3, 4),
            "batch": self.batch,
            "safety": self.safety,
        }
