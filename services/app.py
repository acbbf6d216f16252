"""The FastAPI app: routes, limits, auth, request ids, access logs, metrics; model work on one thread.

Requests are validated on the event loop, then queued for the single model thread (the ranker is not
thread-safe and a CPU or GPU gains nothing from two forward passes at once). At most ``max_queue`` requests
wait for or hold the model; the next one gets 503 with ``Retry-After`` instead of a queue that grows
without limit.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Generator
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from aheadrank.services.backend import Cancelled, RequestError, RerankBackend, StageClock, Work
from aheadrank.services.jsonguard import max_values, shape_problem
from aheadrank.services.memory import HeapTrimmer
from aheadrank.services.metrics import ServiceMetrics
from aheadrank.services.schemas import (
    BudgetReport,
    CompatRerankResponse,
    DocumentsRequest,
    DocumentsV1Request,
    DocumentTooLong,
    ErrorResponse,
    InfoResponse,
    RerankRequest,
    RerankResponse,
    RerankResult,
    TeiRank,
    Timings,
)
from aheadrank.services.turns import TurnExecutor, drive
from fastapi import Body, Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import Discriminator, Tag
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from aheadrank import __version__
from aheadrank.errors import AheadrankError, StoreDamagedError

access_log = logging.getLogger("aheadrank.access")
log = logging.getLogger("aheadrank.service")
T = TypeVar("T")
ENDPOINTS = (
    "/v1/rerank",
    "/v2/rerank",
    "/rerank",
    "/infinity/rerank",
    "/v1/info",
    "/health",
    "/ready",
    "/metrics",
)
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 408, 413, 415, 422, 503, 504)
}
NATIVE = "{query, candidates?, depth?, top_n?, time_budget_ms?, return_text?}"
# what a body of the wrong shape is told: which shape each path takes, and where the others go
SHAPES = {
    "/v1/rerank": f"POST /v1/rerank takes the native shape {NATIVE} (BM25 or stored docids) or, with `documents`, "
    "the Cohere v1 / Jina / Voyage shape {query, documents, top_n?, return_documents?}; "
    "TEI's {query, texts} goes to POST /rerank, Cohere v2 to POST /v2/rerank",
    "/v2/rerank": "POST /v2/rerank takes Cohere v2's shape {query, documents, top_n?}; "
    f"BM25 / docid re-ranking is POST /v1/rerank {NATIVE}",
    "/rerank": "POST /rerank takes TEI's {query, texts} or vLLM's / Cohere's {query, documents}; "
    f"BM25 / docid re-ranking is POST /v1/rerank {NATIVE}",
    "/infinity/rerank": "POST /infinity/rerank takes Infinity's shape {query, documents, top_n?, return_documents?}; "
    f"BM25 / docid re-ranking is POST /v1/rerank {NATIVE}",
}


_SHAPE_TAGS = ("native shape", "documents shape")


def _v1_shape(body: Any) -> str:
    """/v1/rerank serves two shapes: a body with `documents` is Cohere v1 / Jina / Voyage, any other native."""
    return _SHAPE_TAGS[1] if isinstance(body, dict) and "documents" in body else _SHAPE_TAGS[0]


V1Body = Annotated[
    Annotated[RerankRequest, Tag(_SHAPE_TAGS[0])] | Annotated[DocumentsV1Request, Tag(_SHAPE_TAGS[1])],
    Discriminator(_v1_shape),
]


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def _error_response(
    request_id: str | None, status: int, message: str, kind: str, headers=None
) -> JSONResponse:
    body = ErrorResponse(error=message, kind=kind, request_id=request_id, message=message).model_dump()
    return JSONResponse(body, status_code=status, headers=headers)


PUBLIC = ("/health", "/ready", "/metrics")  # no key asked; every other route of ENDPOINTS needs one
_CLOSE = {"Connection": "close"}


class BodyTimeout(Exception):
    """The body did not arrive within ``body_timeout`` of the request's head."""


class Gate:
    """Pure ASGI middleware: request id, arrival time, access log, request metrics, and what a request must
    pass before its body is read: Content-Type, the API key and Content-Length against the body limit, all
    from the headers, so a request that will be refused costs no body buffer. The body is then read chunk by
    chunk against the limit and ``body_timeout`` (408). A route outside ENDPOINTS never has its body read."""

    def __init__(
        self,
        app,
        max_body_bytes: int,
        metrics: ServiceMetrics,
        access: bool,
        api_keys: list[str] | None = None,
        body_timeout: float = math.inf,
        json_limits: tuple[int, int] = (32, 100_000),
    ):
        self.app, self.max_body, self.metrics, self.access = app, max_body_bytes, metrics, access
        self.json_limits = json_limits  # (depth, values): the body's shape, checked before it is parsed
        self.keys = [k.encode() for k in api_keys or []]
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get("x-request-id", "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {}).update(request_id=rid, arrival=arrival)
        status, started = [500], [False]

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                started[0] = True
                MutableHeaders(scope=message)["x-request-id"] = rid
            await send(message)

        async def reject(code: int, message: str, kind: str, extra: dict | None = None) -> None:
            self.metrics.errors.labels(kind).inc()
            await _error_response(rid, code, message, kind, extra)(scope, receive, send_with_id)

        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        try:
            if "transfer-encoding" in headers and "content-length" in headers:
                # framing the client and a proxy in front could read two ways (request smuggling): refused,
                # and the connection closed, so nothing after this request's body is read as a request
                self.metrics.errors.labels("bad_framing").inc()
                message = "a request must not carry both Content-Length and Transfer-Encoding"
                close = {"Connection": "close"}
                await _error_response(rid, 400, message, "bad_framing", close)(scope, receive, send_with_id)
                return
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            if scope.get("method") == "POST" and ctype != "application/json" and not ctype.endswith("+json"):
                said = f"not {ctype!r}" if ctype else "and the request has none"
                await reject(415, f"Content-Type must be application/json, {said}", "content_type")
                return
            if endpoint == "other":  # 404 / 405 from the router, which never reads a body
                await self.app(scope, receive, send_with_id)
                return
            refusal = None if path in PUBLIC else key_refusal(self.keys, headers.get("authorization", ""))
            if refusal is not None:  # unauthenticated: answered from the headers, the connection closed
                await reject(refusal.status, refusal.message, refusal.kind, {**refusal.headers, **_CLOSE})
                return
            try:
                body_receive = await self._bounded_body(scope, receive, headers, arrival)
            except BodyTimeout:
                await reject(
                    408,
                    f"the request body did not arrive within {self.body_timeout:g} s "
                    "(--body-timeout / AHEADRANK_BODY_TIMEOUT)",
                    "body_timeout",
                    _CLOSE,
                )
                return
            if body_receive is None:
                await reject(413, f"request body over the limit of {self.max_body} bytes", "body_too_large")
            elif isinstance(body_receive, str):  # nested too deep or too many values: refused unparsed
                await reject(422, body_receive, "json_shape")
            else:
                await self.app(scope, body_receive, send_with_id)
        except Exception as exc:  # a bug, never client input: one log line and a JSON 500, not re-raised
            self.metrics.errors.labels("internal").inc()
            _log_internal(rid, path, exc)
            if not started[0]:
                message = f"internal error; request id {rid}"
                await _error_response(rid, 500, message, "internal")(scope, receive, send_with_id)
        finally:
            took = time.perf_counter() - arrival
            self.metrics.requests.labels(endpoint, str(status[0])).inc()
            if endpoint != "other":
                self.metrics.latency.labels(endpoint).observe(took)
            if self.access:
                client = scope.get("client") or ("-", 0)
                access_log.info(
                    json.dumps(
                        {
                            "event": "access",
                            "request_id": rid,
                            "method": scope.get("method"),
                            "path": path,
                            "status": status[0],
                            "ms": round(took * 1e3, 2),
                            "client": f"{client[0]}:{client[1]}",
                        }
                    )
                )

    async def _bounded_body(self, scope, receive, headers, arrival: float):
        """Read the whole body if it is within the limit (and arrives within ``body_timeout``) and replay it
        to the app; None if it is over the limit; raises BodyTimeout."""
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return receive
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            return None
        body, more = bytearray(), True
        until = arrival + self.body_timeout
        while more:
            try:
                left = until - time.perf_counter()
                message = await (
                    receive() if left == math.inf else asyncio.wait_for(receive(), max(0.0, left))
                )
            except asyncio.TimeoutError:
                raise BodyTimeout from None
            if message["type"] == "http.disconnect":
                return receive
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return None
            more = message.get("more_body", False)
        whole, sent = bytes(body), [False]
        del body
        problem = await _json_shape(whole, *self.json_limits)
        if problem is not None:
            return problem

        async def replay():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        return replay


async def _json_shape(body: bytes, depth: int, values: int) -> str | None:
    """services/jsonguard.py on the raw body; a large one off the event loop (tens of ms per MB at worst)."""
    if len(body) < 1 << 20:
        return shape_problem(body, depth, values)
    return await asyncio.to_thread(shape_problem, body, depth, values)


# uvicorn's graceful shutdown (aheadrank/cli/serve.py) waits 10 s for responses, then cancels them (a
# plain-text 500): a request on the model thread gets this long to finish, then is answered 503 in JSON
RUNNING_GRACE_S = 5.0


class _Drain:
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


def _log_internal(rid: str | None, path: str, exc: BaseException) -> None:
    """A 500: one structured line at ERROR (the exception's type and the start of its message); the
    traceback only at DEBUG, so a request that keeps failing cannot write kilobytes per request."""
    error = f"{type(exc).__name__}: {exc}"
    event = {"event": "internal_error", "request_id": rid, "path": path, "error": error[:300]}
    log.error(json.dumps(event))
    log.debug("internal error (request id %s)", rid, exc_info=exc)


def _validation_message(exc: RequestValidationError, path: str = "") -> str:
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", *_SHAPE_TAGS)) or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    message = "; ".join(parts) or "invalid request"
    return f"{message}. {SHAPES[path]}" if path in SHAPES else message


def _server_timing(seconds: dict[str, float], total: float) -> str:
    items = [f"{k};dur={v * 1e3:.3f}" for k, v in seconds.items() if v > 0]
    return ", ".join([*items, f"total;dur={total * 1e3:.3f}"])


def _rid(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def _install_error_handlers(app: FastAPI, metrics: ServiceMetrics) -> None:
    """Every error is a JSON body that says what is wrong (and counted by kind)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        metrics.errors.labels(exc.kind).inc()
        return _error_response(_rid(request), exc.status, exc.message, exc.kind, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        metrics.errors.labels("validation").inc()
        return _error_response(_rid(request), 422, _validation_message(exc, request.url.path), "validation")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}.get(exc.status_code, "http")
        metrics.errors.labels(kind).inc()
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 400 and "parsing the body" in detail:
            detail = "the request body is not valid JSON (or not UTF-8)"
        return _error_response(_rid(request), exc.status_code, detail, kind, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        metrics.errors.labels("internal").inc()
        _log_internal(_rid(request), request.url.path, exc)
        return _error_response(_rid(request), 500, f"internal error; request id {_rid(request)}", "internal")


def key_refusal(keys: list[bytes], header: str) -> ApiError | None:
    """Why an ``Authorization`` header is refused (None: accepted, or no keys configured)."""
    if not keys:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if not header or scheme.lower() != "bearer" or not token:
        return ApiError(
            401,
            "missing API key: send 'Authorization: Bearer <key>'",
            "auth_missing",
            {"WWW-Authenticate": "Bearer"},
        )
    if not any(hmac.compare_digest(token.encode(), k) for k in keys):
        return ApiError(403, "API key not accepted", "auth_invalid")
    return None


def _key_check(api_keys: list[str]) -> Callable[[Request], None]:
    """The dependency that refuses a request without an accepted Bearer key (none configured: no auth)."""
    keys = [k.encode() for k in api_keys]

    def require_key(request: Request) -> None:
        refusal = key_refusal(keys, request.headers.get("authorization", ""))
        if refusal is not None:
            raise refusal

    return require_key


class ModelThread:
    """The one model thread and the requests waiting for it: at most ``max_queue`` wait or run (the next one
    gets 503), each dropped when its client goes away or its deadline passes, and refused at shutdown."""

    def __init__(self, settings, metrics: ServiceMetrics, drain: _Drain) -> None:
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


class Handlers:
    """What the re-ranking routes do: check a request against the limits, run it on the model thread, and
    answer in the shape its API expects."""

    def __init__(self, backend: RerankBackend, metrics: ServiceMetrics, model: ModelThread) -> None:
        self.backend, self.settings, self.metrics, self.model = backend, backend.settings, metrics, model

    def check_query(self, query: str) -> None:
        if len(query) > self.settings.max_query_chars:
            raise ApiError(
                413,
                f"query has {len(query)} characters; the limit is {self.settings.max_query_chars}",
                "query_too_long",
            )

    async def rerank_native(self, req: RerankRequest, request: Request) -> JSONResponse:
        self.check_query(req.query)
        if req.candidates is not None:
            if len(req.candidates) > self.settings.max_candidates:
                raise ApiError(
                    413,
                    f"{len(req.candidates)} candidates; the limit is {self.settings.max_candidates}",
                    "too_many_candidates",
                )
            if not req.candidates:
                raise ApiError(
                    422, "candidates must not be empty (leave it out for BM25 candidates)", "validation"
                )
            limit = self.settings.max_docid_chars
            long = next((i for i, d in enumerate(req.candidates) if len(d) > limit), None)
            if long is not None:  # before any lookup is sized by it
                raise ApiError(
                    413,
                    f"candidates.{long} has {len(req.candidates[long])} characters; the limit for a docid is "
                    f"{limit} (--max-docid-chars / AHEADRANK_MAX_DOCID_CHARS)",
                    "docid_too_long",
                )
        depth = req.depth or min(self.settings.default_depth, self.settings.max_candidates)
        if depth > self.settings.max_candidates:
            raise ApiError(
                413,
                f"depth {depth} is over the limit of {self.settings.max_candidates}",
                "too_many_candidates",
            )
        arrival = request.state.arrival
        clock = StageClock()
        out = await self.model.run(
            lambda work: self.backend.rerank_steps(
                req.query,
                req.candidates,
                depth,
                req.time_budget_ms,
                arrival,
                clock,
                req.return_text,
                work,
                req.pure,
            ),
            request,
            "/v1/rerank",
        )
        shown = out.ranked[: req.top_n] if req.top_n else out.ranked
        results = [
            RerankResult(
                docid=d,
                rank=i + 1,
                score=s,
                bm25_score=b,
                neural_score=out.parts.get(d, (None, None))[0],
                dense_score=out.parts.get(d, (None, None))[1],
                text=out.texts.get(d) if req.return_text else None,
            )
            for i, (d, s, b) in enumerate(shown)
        ]
        total = time.perf_counter() - arrival
        self.metrics.observe_stages("/v1/rerank", clock.seconds)
        self.metrics.candidates.labels("/v1/rerank").observe(out.candidates)
        self.metrics.reranked.observe(out.reranked)
        budget = None
        if req.time_budget_ms is not None:
            budget = BudgetReport(
                time_budget_ms=req.time_budget_ms,
                planned_depth=out.planned_depth or 0,
                per_doc_ms=self.backend.latency.per_doc_s * 1e3,
            )
        body = RerankResponse(
            results=results,
            reranked=out.reranked,
            candidates=out.candidates,
            missing_from_store=out.missing,
            model=self.backend.model_name,
            scoring=out.scoring,
            budget=budget,
            timings=Timings(**clock.ms(), total_ms=round(total * 1e3, 3)),
            request_id=_rid(request) or "",
        )
        return JSONResponse(
            body.model_dump(mode="json"), headers={"Server-Timing": _server_timing(clock.seconds, total)}
        )

    async def rank_documents(
        self, req: DocumentsRequest, request: Request, endpoint: str, style: str
    ) -> JSONResponse:
        """Ad-hoc texts (the document side runs online), answered in the shape of the API `style` names."""
        self.check_query(req.query)
        try:
            docs, items = req.docs(), req.items(self.settings.max_document_chars)
        except DocumentTooLong as exc:
            raise ApiError(413, str(exc), "document_too_long") from exc
        except ValueError as exc:
            raise ApiError(422, f"{exc}. {SHAPES[endpoint]}", "validation") from exc
        if not items:
            raise ApiError(422, "documents must not be empty", "validation")
        if len(items) > self.settings.max_documents:
            raise ApiError(
                413,
                f"{len(items)} documents; the limit is {self.settings.max_documents} per request",
                "too_many_documents",
            )
        long = [i for i, t in enumerate(items) if len(t) > self.settings.max_document_chars]
        if long:
            raise ApiError(
                413,
                f"document(s) {long[:10]} over the limit of {self.settings.max_document_chars} characters",
                "document_too_long",
            )
        arrival = request.state.arrival
        clock = StageClock()

        def work(w: Work):
            clock.seconds["queue"] = time.perf_counter() - arrival
            if req.refuse_long():
                over = self.backend.overlong(items)
                if over:
                    raise RequestError(
                        f"{len(over)} text(s) longer than the model reads ({self.backend.max_doc_len()} word pieces), "
                        f"e.g. texts.{over[0][0]} with {over[0][1]}: `truncate: false` refuses instead of "
                        "cutting (send `truncate: true` to cut them, or leave it out to score them as passages)",
                        "input_too_long",
                        413,
                    )
            passages = self.backend.passage_options(
                req.max_chunks_per_doc, req.max_tokens_per_doc, req.cut_long()
            )
            return (yield from self.backend.score_texts_steps(req.query, items, clock, w, passages=passages))

        scores, tokens = await self.model.run(work, request, endpoint)
        shown = [1.0 / (1.0 + math.exp(-s)) if not req.raw_scores else s for s in scores]
        order = sorted(range(len(items)), key=lambda i: (-scores[i], i))
        if req.keep():
            order = order[: req.keep()]
        total = time.perf_counter() - arrival
        self.metrics.observe_stages(endpoint, clock.seconds)
        self.metrics.candidates.labels(endpoint).observe(len(items))
        kind = self.backend.score_kind()  # calibrated / relative / uncalibrated (services/README.md)
        headers = {"Server-Timing": _server_timing(clock.seconds, total), "X-Relevance-Score": kind}
        timings = {**clock.ms(), "total_ms": round(total * 1e3, 3)}
        if style == "tei":
            ranks = [
                TeiRank(index=i, score=shown[i], text=items[i] if req.return_text else None) for i in order
            ]
            return JSONResponse([r.model_dump(exclude_none=True) for r in ranks], headers=headers)

        def as_object(i: int) -> dict:  # Cohere / Jina / vLLM: {text, ...the client's own fields, e.g. id}
            d = docs[i]
            return dict(d) if isinstance(d, dict) else {"text": d}

        want = bool(req.return_documents)
        results = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": shown[i]}
            if want:
                result["document"] = items[i] if style == "infinity" else as_object(i)
            results.append(result)
        request_id = _rid(request) or uuid.uuid4().hex
        if style == "infinity":
            body: dict[str, Any] = {
                "object": "rerank",
                "id": request_id,
                "created": int(time.time()),
                "model": self.backend.model_name,
                "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
            return JSONResponse(body, headers=headers)
        body = {
            "id": request_id,
            "model": self.backend.model_name,
            "results": results,
            "usage": {"total_tokens": tokens},
            "meta": {
                "api_version": {"version": "2" if style == "v2" else "1"},
                "billed_units": {"search_units": 1},
                "timings": timings,
                "relevance_score": kind,
            },
        }
        if (
            style == "v1"
        ):  # Voyage reads `data` (its `document` is the text); Cohere v1 and Jina read `results`
            body["object"] = "list"
            body["data"] = [{**r, "document": items[r["index"]]} if want else dict(r) for r in results]
        return JSONResponse(body, headers=headers)


def _store_status(backend: RerankBackend, metrics: ServiceMetrics) -> dict | None:
    """/ready's ``store``: its file leases (``held`` / ``none``) and how far the sha256 verification got."""
    if not backend.readers():
        return None
    verification = backend.verification().status()
    lease = backend.lease_state()
    total = verification["bytes_total"]
    metrics.store_verified.set(verification["bytes_done"] / total if total else 1.0)
    if lease is not None:
        metrics.store_leased.set(1 if lease == "held" else 0)
    keys = ("mode", "state", "shards_done", "shards_total", "bytes_done", "bytes_total")
    return {"lease": lease, "verification": {k: verification[k] for k in keys}}


def _ops_routes(
    app: FastAPI, backend: RerankBackend, metrics: ServiceMetrics, drain: _Drain, require_key: Callable
) -> None:
    """/health, /ready, /metrics, /v1/info."""

    @app.get("/health", tags=["ops"])
    async def health() -> dict:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/ready", tags=["ops"], responses={503: {"model": ErrorResponse}})
    async def ready():
        """Readiness: model loaded on its device, store and index open, warm-up done."""
        if not backend.ready:
            return _error_response(None, 503, "warming up", "not_ready")
        if drain.on:
            return _error_response(None, 503, "shutting down", "shutting_down")
        damaged = backend.check_shards()
        store = _store_status(backend, metrics)
        if damaged:
            metrics.damaged_shards.set(len(damaged))
            problems = "; ".join(f"{file}: {why}" for file, why in damaged.items())
            return _error_response(
                None,
                503,
                f"store damaged, documents in these shards are refused: {problems}",
                "store_damaged",
            )
        return {"status": "ready", "model": backend.model_name, **({"store": store} if store else {})}

    for path, probe in (("/health", health), ("/ready", ready)):  # HEAD answers like GET, without a body
        app.add_api_route(path, probe, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", tags=["ops"])
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/v1/info",
        response_model=InfoResponse,
        tags=["ops"],
        dependencies=[Depends(require_key)],
        responses=ERRORS,
    )
    async def info() -> dict:
        return backend.info()


def _rerank_routes(app: FastAPI, h: Handlers, require_key: Callable) -> None:
    """/v1/rerank (native, or Cohere v1 / Jina / Voyage with `documents`), /v2/rerank, /rerank, /infinity/rerank."""

    @app.post(
        "/v1/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": RerankResponse | CompatRerankResponse}, **ERRORS},
    )
    async def rerank_v1(body: Annotated[V1Body, Body()], request: Request):
        """The native shape (no `documents`): re-rank BM25 top-`depth` (or the given candidate docids) through
        the stored representations. With `documents`: Cohere v1 / Jina / Voyage re-ranking of ad-hoc texts."""
        if isinstance(body, DocumentsRequest):
            return await h.rank_documents(body, request, "/v1/rerank", "v1")
        return await h.rerank_native(body, request)

    @app.post(
        "/v2/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": CompatRerankResponse}, **ERRORS},
    )
    async def rerank_v2(req: DocumentsRequest, request: Request):
        """Cohere v2: `{model, query, documents, top_n?, max_tokens_per_doc?}` → `{id, results: [{index,
        relevance_score}], meta}` (`document` only with `return_documents: true`, as the v5 SDKs asked)."""
        return await h.rank_documents(req, request, "/v2/rerank", "v2")

    @app.post(
        "/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": CompatRerankResponse | list[TeiRank]}, **ERRORS},
    )
    async def rerank_compat(req: DocumentsRequest, request: Request):
        """TEI `{query, texts, return_text?, raw_scores?, truncate?}` → `[{index, score, text?}]`; vLLM / Cohere
        `{query, documents, ...}` → `{id, model, results: [{index, relevance_score, document?}], usage}`."""
        return await h.rank_documents(req, request, "/rerank", "tei" if req.texts is not None else "vllm")

    @app.post(
        "/infinity/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": CompatRerankResponse}, **ERRORS},
    )
    async def rerank_infinity(req: DocumentsRequest, request: Request):
        """Infinity's `/rerank` (LiteLLM `infinity/…` with `api_base=<server>/infinity`): `document` is a string."""
        return await h.rank_documents(req, request, "/infinity/rerank", "infinity")


def create_app(backend: RerankBackend) -> FastAPI:
    """One app around a loaded (and warmed-up) backend."""
    settings = backend.settings
    metrics = ServiceMetrics()
    metrics.info.labels(
        backend.model_name, backend.ranker.kind, backend.ranker.fingerprint, backend.device
    ).set(1)
    drain = _Drain()
    model = ModelThread(settings, metrics, drain)
    metrics.watch_text_cache(backend.text_cache)
    for reader in backend.readers():  # the ranker's store and its dense field, counted together
        reader.on_damage(
            lambda file, reason: metrics.damaged_shards.set(sum(len(r.damaged) for r in backend.readers()))
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        drain.bind()
        if settings.verify_store == "background" and backend.readers():
            backend.verification().start()  # after warm-up: the latency model is fitted without it
        yield
        model.close(jvm=backend.searcher is not None)

    app = FastAPI(
        title="aheadrank",
        version=__version__,
        description="Re-ranking through precomputed document representations (DESIGN.md, 'The service').",
        lifespan=lifespan,
        redirect_slashes=False,  # "/health/" is 404, never a redirect to a Location built from the Host header
    )
    app.state.backend = backend
    app.state.metrics = metrics
    app.state.begin_drain = drain.begin  # aheadrank/cli/serve.py calls it on SIGTERM/SIGINT
    app.add_middleware(
        Gate,
        max_body_bytes=settings.max_body_bytes,
        metrics=metrics,
        access=settings.access_log,
        api_keys=settings.api_keys,
        body_timeout=settings.body_timeout,
        json_limits=(settings.max_json_depth, max_values(settings)),
    )
    _install_error_handlers(app, metrics)
    require_key = _key_check(settings.api_keys)
    _ops_routes(app, backend, metrics, drain, require_key)
    _rerank_routes(app, Handlers(backend, metrics, model), require_key)
    return app
