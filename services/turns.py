"""The model thread as an executor that takes turns: requests interleaved chunk by chunk.

The ranker runs on one thread (it is not thread-safe, and two forward passes at once gain nothing on a CPU
or a GPU). Run first-come first-served, a request of a thousand ad-hoc documents holds every other request for
its whole run. :class:`TurnExecutor` is a one-thread :class:`concurrent.futures.Executor` whose jobs may be
*generators*: a generator job runs one step (up to its next ``yield``: the backend yields before each scoring
chunk) and goes to the back of the line, so the requests in progress take turns a chunk at a time (round
robin). A small request waits for at most one chunk of each request ahead of it instead of their whole runs;
a large one is slowed by the small ones' chunks only. A plain function runs in one turn.

Everything still runs on the one thread, in order, so thread-local state (torch's grad mode, the JVM thread
attachment for BM25) and the ranker's buffers see one caller; a request's state between its chunks lives in
its generator (the query representation is its own copy).
"""

from __future__ import annotations

import collections
import inspect
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Executor, Future
from typing import Any


class _Job:
    __slots__ = ("args", "fn", "future", "gen", "kwargs")

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, future: Future) -> None:
        self.fn, self.args, self.kwargs, self.future = fn, args, kwargs, future
        self.gen: Generator | None = None


def drive(steps: Generator[Any, None, Any], on_turn: Callable[[float], None] | None = None) -> Any:
    """Run a step generator to its end in the caller's thread; returns its return value. ``on_turn``: called with
    each step's seconds, as :class:`TurnExecutor`'s (the last step, which returns, included)."""
    while True:
        t = time.perf_counter()
        try:
            next(steps)
        except StopIteration as stop:
            if on_turn is not None:
                on_turn(time.perf_counter() - t)
            return stop.value
        if on_turn is not None:
            on_turn(time.perf_counter() - t)


class TurnExecutor(Executor):
    """One worker thread; generator jobs are stepped round robin (see the module's docstring)."""

    def __init__(
        self, thread_name: str = "aheadrank-model", on_turn: Callable[[float], None] | None = None
    ) -> None:
        self.on_turn = on_turn  # called on the model thread with each turn's seconds (a metric)
        self._line: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._shutdown = False
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)
        self._thread.start()
        self.turns = 0  # steps run, for tests and metrics

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._line.append(_Job(fn, args, kwargs, future))
            self._cond.notify()
        return future

    def discard(self, future: Future) -> bool:
        """Take a job that has not started out of the line and cancel its future (its caller answered it
        already: a deadline passed or its client left); False if it has started (it stops at its next check)
        or ended. The line holds only work someone waits for, and the job's arguments are freed now."""
        with self._cond:
            for job in self._line:
                if job.future is future:
                    if job.gen is not None:
                        return False
                    self._line.remove(job)
                    return future.cancel()
        return False

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                for job in self._line:
                    if job.gen is None:
                        job.future.cancel()
                self._line = collections.deque(j for j in self._line if j.gen is not None)
            self._cond.notify()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._line and not self._shutdown:
                    self._cond.wait()
                if not self._line:
                    return  # shut down, nothing left
                job = self._line.popleft()
            t = time.perf_counter()
            more = self._step(job)
            if self.on_turn is not None:
                self.on_turn(time.perf_counter() - t)
            if more:
                with self._cond:
                    self._line.append(job)  # the back of the line: the others' turns first

    def _step(self, job: _Job) -> bool:
        """One turn of ``job``; True if it has more steps."""
        self.turns += 1
        if job.gen is None:
            if not job.future.set_running_or_notify_cancel():
                return False
            try:
                out = job.fn(*job.args, **job.kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting side
                job.future.set_exception(exc)
                return False
            if not inspect.isgenerator(out):
                job.future.set_result(out)
                return False
            job.gen = out
        try:
            next(job.gen)
        except StopIteration as stop:
            job.future.set_result(stop.value)
            return False
        except BaseException as exc:  # noqa: BLE001
            job.future.set_exception(exc)
            return False
        return True
