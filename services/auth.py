"""API keys at request time: the Bearer-key check that the gate runs on the headers and the routes run as a
dependency (services/keys.py parses the configured keys)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from aheadrank.services.errors import ApiError
from fastapi import Request

PUBLIC = ("/health", "/ready", "/metrics")  # no key asked; every other route of ENDPOINTS needs one


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


def key_check(api_keys: list[str]) -> Callable[[Request], None]:
    """The dependency that refuses a request without an accepted Bearer key (none configured: no auth)."""
    keys = [k.encode() for k in api_keys]

    def require_key(request: Request) -> None:
        refusal = key_refusal(keys, request.headers.get("authorization", ""))
        if refusal is not None:
            raise refusal

    return require_key
