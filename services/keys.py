"""API keys: the one parsing rule for every source (``--api-key``, ``AHEADRANK_API_KEY(S)``, ServiceSettings).

Each value holds one key or several separated by commas and/or whitespace (``"a,b"``, ``"a b"``, ``"a, b"``
are the same two keys). A key is visible ASCII (it travels in an ``Authorization`` header). A value that
yields no key (``--api-key=``, ``AHEADRANK_API_KEYS="  "``) or an empty item (``"a,,b"``) is an error, never
a silently open service: leaving keys out entirely is the only way to serve without auth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from aheadrank.errors import AheadrankError

_KEY = re.compile(r"^[\x21-\x7e]+$")
ENV_VARS = ("AHEADRANK_API_KEY", "AHEADRANK_API_KEYS")


class ApiKeyError(AheadrankError, ValueError):
    """An empty or malformed API key (a ValueError too, so pydantic reports it as a validation error)."""


def parse_api_keys(values: str | Iterable[str] | None) -> list[str]:
    """Keys in first-seen order, duplicates dropped; ``None`` or no values at all: ``[]`` (no auth)."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    keys: list[str] = []
    for value in values:
        if not isinstance(value, str):
            raise ApiKeyError(f"an API key must be a string, got {type(value).__name__}")
        parts = value.split(",")
        for n, part in enumerate(parts, 1):
            words = part.split()
            if not words:  # the message never quotes the value: its other items are secrets
                where = (
                    "an empty API key"
                    if len(parts) == 1
                    else f"an empty item (item {n} of {len(parts)}) in a comma-separated API key list"
                )
                raise ApiKeyError(
                    f"{where}: an empty key would switch authentication off. Give real keys, or leave "
                    "--api-key / AHEADRANK_API_KEYS out to serve without authentication"
                )
            for key in words:
                if not _KEY.match(key):
                    raise ApiKeyError("API keys must be visible ASCII characters (they travel in a header)")
                if key not in keys:
                    keys.append(key)
    return keys


def keys_from_cli(flag_values: list[str], environ: dict[str, str]) -> list[str]:
    """``--api-key`` values if any were given, else the environment's (read raw: a blank variable is an
    error, where click would have split it into nothing)."""
    if flag_values:
        return parse_api_keys(flag_values)
    return parse_api_keys([environ[name] for name in ENV_VARS if name in environ])


def service_keys(flag_values: list[str], keys_file, environ: dict[str, str]) -> list[str]:
    """What ``aheadrank serve`` accepts: the ``--api-key`` values given on the command line (``flag_values``),
    else those of both ``AHEADRANK_API_KEY`` and ``AHEADRANK_API_KEYS`` (click would take the first one set and
    drop the other), plus ``keys_file``'s (``--api-keys-file``, or ``AHEADRANK_API_KEYS_FILE`` when the flag is
    not given: read once, the flag replacing the variable)."""
    keys = keys_from_cli(flag_values, environ)
    if keys_file is not None:
        from aheadrank.services.settings import read_keys_file

        try:
            keys += [k for k in read_keys_file(keys_file) if k not in keys]
        except ValueError as exc:
            raise ApiKeyError(str(exc)) from None
    return keys
