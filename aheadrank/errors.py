"""Errors every part raises for bad input; the CLI and the service turn them into clear messages."""

from __future__ import annotations


class AheadrankError(Exception):
    """Base class: a user-facing error with a message that says what is wrong."""


class CheckpointError(AheadrankError):
    """A missing, partial, corrupt or mismatched checkpoint."""


class StoreError(AheadrankError):
    """A missing, corrupt, incompatible or half-written representation store."""


class CollectionError(AheadrankError):
    """A malformed document collection."""


class StoreDamagedError(StoreError):
    """A shard of an open store changed or broke under a running reader (truncated, rewritten, corrupt
    values): the requests that need it are refused; the rest of the store keeps being served."""

    def __init__(self, message: str, files: list[str] | None = None):
        super().__init__(message)
        self.files = list(files or [])


class TrainingError(AheadrankError, ValueError):
    """Training that cannot start or go on as asked: no trainable query, a state written for another run, a loss
    that is no longer a number."""
