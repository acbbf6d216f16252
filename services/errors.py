"""Errors as JSON: :class:`ApiError` (what a handler raises), the error body, the handlers that answer every
error (validation, HTTP, internal) in that body and count it by kind, and the one log line of a 500."""

from __future__ import annotations

import json
import logging
from typing import Any

from aheadrank.services.metrics import ServiceMetrics
from aheadrank.services.schemas import ErrorResponse
from aheadrank.services.shapes import SHAPE_TAGS, SHAPES
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("aheadrank.service")
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 408, 413, 415, 422, 503, 504)
}


class ApiError(Exception):
    """A refusal answered as JSON: its status, message, kind (``aheadrank_errors_total{kind}``) and headers."""

    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


ERROR_KIND_HEADER = "X-Error-Kind"


def error_response(
    request_id: str | None, status: int, message: str, kind: str, headers=None
) -> JSONResponse:
    body = ErrorResponse(error=message, kind=kind, request_id=request_id, message=message).model_dump()
    # the kind in a header too: the access log line names it (services/gate.py), clients may read it
    return JSONResponse(body, status_code=status, headers={**(headers or {}), ERROR_KIND_HEADER: kind})


def log_internal(rid: str | None, path: str, exc: BaseException) -> None:
    """A 500: one structured line at ERROR (the exception's type and the start of its message); the
    traceback only at DEBUG, so a request that keeps failing cannot write kilobytes per request."""
    error = f"{type(exc).__name__}: {exc}"
    event = {"event": "internal_error", "request_id": rid, "path": path, "error": error[:300]}
    log.error(json.dumps(event))
    log.debug("internal error (request id %s)", rid, exc_info=exc)


def validation_message(exc: RequestValidationError, path: str = "") -> str:
    parts = []
    for err in exc.errors()[:10]:
        if err.get("type") == "json_invalid":  # its loc is the character where parsing stopped, not a field
            at = next((x for x in err.get("loc", ()) if isinstance(x, int)), None)
            why = (err.get("ctx") or {}).get("error") or "not JSON"
            parts.append(
                f"the body is not valid JSON{f' at character {at}' if at is not None else ''}: {why}"
            )
            continue
        loc = ".".join(str(x) for x in err.get("loc", ()) if x not in ("body", *SHAPE_TAGS)) or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    message = "; ".join(parts) or "invalid request"
    return f"{message}. {SHAPES[path]}" if path in SHAPES else message


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def install_error_handlers(app: FastAPI, metrics: ServiceMetrics) -> None:
    """Every error is a JSON body that says what is wrong (and counted by kind)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        metrics.errors.labels(exc.kind).inc()
        return error_response(request_id_of(request), exc.status, exc.message, exc.kind, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        metrics.errors.labels("validation").inc()
        return error_response(
            request_id_of(request), 422, validation_message(exc, request.url.path), "validation"
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}.get(exc.status_code, "http")
        metrics.errors.labels(kind).inc()
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 400 and "parsing the body" in detail:
            detail = (
                "the request body cannot be read as JSON: not JSON, not UTF-8, or a number too long to read"
            )
        return error_response(
            request_id_of(request), exc.status_code, detail, kind, getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        metrics.errors.labels("internal").inc()
        rid = request_id_of(request)
        log_internal(rid, request.url.path, exc)
        return error_response(rid, 500, f"internal error; request id {rid}", "internal")
