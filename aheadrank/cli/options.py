"""Helpers shared by every part's CLI commands: clear errors instead of tracebacks, env-mirrored options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from aheadrank.errors import AheadrankError

F = TypeVar("F", bound=Callable[..., Any])


def env(name: str) -> str:
    """The environment variable that mirrors a CLI option: ``--max-doc-len`` -> ``AHEADRANK_MAX_DOC_LEN``."""
    return "AHEADRANK_" + name.lstrip("-").upper().replace("-", "_")


def user_errors(func: F) -> F:
    """Turn AheadrankError (bad input) into ``error: ...`` on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AheadrankError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
