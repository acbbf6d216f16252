"""The gate: pure ASGI middleware that every request passes before a route sees it (request id, access log,
request metrics, framing, Content-Type, API key, body size, body timeout, JSON shape)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import uuid

from aheadrank.services.auth import PUBLIC, key_refusal
from aheadrank.services.errors import ERROR_KIND_HEADER, error_response, log_internal
from aheadrank.services.jsonguard import shape_problem
from aheadrank.services.metrics import ServiceMetrics
from aheadrank.services.shapes import ENDPOINTS, SHAPES
from starlette.datastructures import MutableHeaders

access_log = logging.getLogger("aheadrank.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
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
        status, started, kind = [500], [False], [None]

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                started[0] = True
                answer = MutableHeaders(scope=message)
                answer["x-request-id"] = rid
                kind[0] = answer.get(ERROR_KIND_HEADER)
            await send(message)

        async def reject(code: int, message: str, kind: str, extra: dict | None = None) -> None:
            self.metrics.errors.labels(kind).inc()
            await error_response(rid, code, message, kind, extra)(scope, receive, send_with_id)

        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        try:
            if "transfer-encoding" in headers and "content-length" in headers:
                # framing the client and a proxy in front could read two ways (request smuggling): refused,
                # and the connection closed, so nothing after this request's body is read as a request
                self.metrics.errors.labels("bad_framing").inc()
                message = "a request must not carry both Content-Length and Transfer-Encoding"
                close = {"Connection": "close"}
                await error_response(rid, 400, message, "bad_framing", close)(scope, receive, send_with_id)
                return
            ctype = headers.get("content-type", "").split(";")[0].strip().lower()
            json_body = scope.get("method") == "POST" and path in SHAPES  # else the router's 404 / 405 first
            if json_body and ctype != "application/json" and not ctype.endswith("+json"):
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
            log_internal(rid, path, exc)
            if not started[0]:
                message = f"internal error; request id {rid}"
                await error_response(rid, 500, message, "internal")(scope, receive, send_with_id)
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
                            **({"error": kind[0]} if kind[0] else {}),  # its kind, never the request's text
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
