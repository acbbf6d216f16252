"""The model thread and the requests waiting for it: queue slots, deadlines, clients that go away, and the
shutdown drain (:class:`Drain`); the turns themselves are services/turns.py."""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections.abc import Callable, Generator
from typing import TypeVar

from aheadrank.services.backend import Cancelled, RequestError, Work
from aheadrank.services.errors import ApiError
from aheadrank.services.memory import HeapTrimmer
from aheadrank.services.metrics import ServiceMetrics
from aheadrank.services.turns import TurnExecutor, drive
from fastapi import Request

from aheadrank.errors import AheadrankError, StoreDamagedError

T = TypeVar("T")

# uvicorn's graceful shutdown (aheadrank/cli/serve.py) waits 10 s for responses, then cancels them (a
# plain-text 500): a request on the model thread gets this long to finish, then is answered 503 in JSON
RUNNING_GRACE_S = 5.0


class Drain:
    """Shutdown: from SIGTERM on, every request still waiting for the model gets 503 with ``Retry-After``
    at once (it never reaches the model), new ones too; one on the model thread may finish within
    ``RUNNING_GRACE_S``, else it is answered 503 and stops before its next chunk."""

    def __init__(self) -> None:
        self.on = False
        self.since = math.inf  # perf_counter() at SIGTERM
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def bind(self) -> None:
        """In the server's event loop (lifespan start, or the first request)."""
        if self._event is None:
            self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
            if self.on:
                self._event.set()

    def begin(self) -> None:
        """Called from a signal handler or any thread."""
        self.since = min(self.since, time.perf_counter())
        self.on = True
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait_for(self, future: asyncio.Future) -> bool:
        """Wait for ``future``; False if the shutdown began first (``future`` may still be running)."""
        self.bind()
        assert self._event is not None
        if self._event.is_set():
            return future.done()
        waiter = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({future, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return future.done()

    @staticmethod
    def refusal() -> ApiError:
        return ApiError(
            503,
            "the server is shutting down; retry (another instance, or this one after its restart)",
            "shutting_down",
            {"Retry-After": "1", "Connection": "close"},
        )


class ModelThread:
    """The one model thread and the requests waiting for it: at most ``max_queue`` wait or run (the next one
    gets 503), each dropped when its client goes away or its deadline passes, and refused at shutdown."""

    def __init__(self, settings, metrics: ServiceMetrics, drain: Drain) -> None:
        self.settings, self.metrics, self.drain = settings, metrics, drain
        # requests take turns a chunk at a time; each turn's seconds in aheadrank_model_turn_seconds
        self.executor = TurnExecutor("aheadrank-model", on_turn=metrics.turn.observe)
        self.pending = [0]
        self.pending_lock = threading.Lock()
        self.trimmer = HeapTrimmer(settings.malloc_trim_interval_s)

    def _trim_heap(self) -> None:
        spent = self.trimmer.maybe_trim()
        if spent is not None:
            self.metrics.malloc_trim.observe(spent)

    def after_request(self) -> None:
        """On the model thread, after a request's work: a heap trim, when due, queued behind the requests
        already waiting (so it never adds to the latency of the request that triggered it)."""
        if not self.trimmer.due():
            return
        try:
            self.executor.submit(self._trim_heap)
        except RuntimeError:  # shutting down: no new work
            pass

    def close(self, jvm: bool) -> None:
        """Finish the running request; with ``jvm``, detach the model thread from the JVM first (it called
        into Java for BM25)."""
        if jvm:
            from aheadrank.indexer.bm25 import detach_thread

            self.executor.submit(detach_thread)
        self.executor.shutdown(wait=True)

    def deadline_error(self, work: Work) -> ApiError:
        return ApiError(
            504,
            f"the request passed its server-side deadline of {self.settings.request_timeout_s:g} s "
            f"(--request-timeout-s / AHEADRANK_REQUEST_TIMEOUT_S, counted from arrival) "
            + (
                f"after scoring {work.chunks_done} of {work.chunks_total} chunks"
                if work.started
                else "in the queue"
            ),
            "deadline_exceeded",
        )

    @staticmethod
    async def watch_disconnect(request: Request, work: Work) -> None:
        """The body is read: the next message is http.disconnect, once the client has gone."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                work.cancel("client_disconnected")
                return

    async def run(self, fn: Callable[[Work], T], request: Request, endpoint: str) -> T:
        """Run ``fn(work)`` on the model thread. Its client gets 504 at the deadline and the request is
        dropped (499) when the client goes away, at once in both cases: a request that has not started
        leaves the line, one that has stops before its next scoring chunk.

        The queue (``--max-queue``) counts the requests whose clients still wait for an answer: a request
        answered (504, 499, 503 at shutdown) frees its slot at once, not when the model thread reaches it.
        Counted until the model thread was done with them, answered requests filled the queue under load:
        their clients came back at once and found it full (503 ``overloaded``) of work nobody waited for."""
        if self.drain.on:
            raise self.drain.refusal()
        job = {"started": False, "cancelled": False, "counted": True}
        with self.pending_lock:
            if self.pending[0] >= self.settings.max_queue:
                raise ApiError(
                    503,
                    f"server busy: {self.pending[0]} requests already queued (max_queue {self.settings.max_queue}); retry later",
                    "overloaded",
                    {"Retry-After": "1"},
                )
            self.pending[0] += 1
            self.metrics.queue.set(self.pending[0])
        work = Work(deadline=request.state.arrival + self.settings.request_timeout_s)

        def release() -> None:
            """The request's slot, freed once: when it is answered or its work ends, whichever is first."""
            with self.pending_lock:
                if job["counted"]:
                    job["counted"] = False
                    self.pending[0] -= 1
                    self.metrics.queue.set(self.pending[0])

        def run() -> Generator[None, None, T]:
            try:
                with self.pending_lock:
                    if job["cancelled"]:  # answered 503 at shutdown while it waited: nothing to do
                        return None  # type: ignore[return-value]
                    job["started"] = True
                work.check()  # dropped before it starts: its client went away or it waited past its deadline
                work.started = True
                out = fn(work)
                if inspect.isgenerator(out):  # steps: other requests' chunks run between its chunks
                    out = (yield from out) if self.settings.interleave else drive(out)
                return out
            finally:
                release()
                self.metrics.chunks.labels(endpoint, "scored").inc(work.chunks_done)
                self.after_request()
                if work.reason is not None:  # the chunks first: a dropped request's count comes last
                    self.metrics.chunks.labels(endpoint, "skipped").inc(
                        max(0, work.chunks_total - work.chunks_done)
                    )
                    stage = "running" if work.started else "queued"
                    self.metrics.cancelled.labels(endpoint, work.reason, stage).inc()

        def drop(reason: str) -> None:
            """Answered without its result: the model thread stops it before its next chunk, or never
            starts it (out of the line now)."""
            work.cancel(reason)
            if self.executor.discard(job_future):
                self.metrics.cancelled.labels(endpoint, work.reason, "queued").inc()
            future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning

        job_future = self.executor.submit(run)
        future = asyncio.wrap_future(job_future)
        watcher = asyncio.create_task(self.watch_disconnect(request, work))
        either = asyncio.ensure_future(asyncio.wait({future, watcher}, return_when=asyncio.FIRST_COMPLETED))
        try:
            try:  # the result, the deadline, the client leaving or the shutdown: whichever comes first
                await asyncio.wait_for(
                    self.drain.wait_for(either), timeout=max(0.0, work.deadline - time.perf_counter())
                )
            except asyncio.TimeoutError:
                pass
            finally:
                either.cancel()
            if future.done():
                finished: bool | None = True
            elif watcher.done():  # the client went away: nobody to answer
                drop("client_disconnected")
                raise Cancelled("client_disconnected")
            elif self.drain.on:
                finished = False
            else:
                finished = None
            if finished is False:  # shutting down: a request still queued is refused at once
                with self.pending_lock:
                    job["cancelled"] = not job["started"]
                if job["cancelled"]:
                    drop("shutting_down")
                    raise self.drain.refusal()
                until = min(work.deadline, self.drain.since + RUNNING_GRACE_S)
                try:  # the request on the model thread may finish (within its deadline and the grace)
                    await asyncio.wait_for(
                        asyncio.shield(future), timeout=max(0.0, until - time.perf_counter())
                    )
                    finished = True
                except asyncio.TimeoutError:
                    finished = None
                if finished is None and time.perf_counter() < work.deadline:
                    drop("shutting_down")  # the model thread stops before its next chunk
                    raise self.drain.refusal()
            if finished is None:
                drop("deadline")
                raise self.deadline_error(work)
            if future.cancelled():  # taken out of the line by the executor's shutdown
                raise self.drain.refusal()
            return future.result()
        except Cancelled as exc:
            if exc.reason == "deadline":
                raise self.deadline_error(work) from exc
            if exc.reason == "shutting_down":
                raise self.drain.refusal() from exc
            raise ApiError(
                499, "the client closed the connection; the request was dropped", exc.reason
            ) from exc
        except RequestError as exc:
            raise ApiError(exc.status, str(exc), exc.kind) from exc
        except StoreDamagedError as exc:  # a shard broke under the server: refused, the rest is served
            raise ApiError(503, str(exc), "store_damaged") from exc
        except AheadrankError as exc:  # the server's own data went bad under it (e.g. a store file)
            raise ApiError(503, str(exc), "server_data") from exc
        finally:
            watcher.cancel()
            release()  # answered: the slot is free now, whatever the model thread still does with it
