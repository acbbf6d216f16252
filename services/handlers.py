"""What the re-ranking handlers share (services/native.py, services/compat.py): the backend, the metrics and
the model thread, the query's limit, and the Server-Timing header."""

from __future__ import annotations

from aheadrank.services.backend import RerankBackend
from aheadrank.services.errors import ApiError
from aheadrank.services.metrics import ServiceMetrics
from aheadrank.services.modelthread import ModelThread


class Handler:
    """A re-ranking handler: check a request against the limits, run it on the model thread, and answer in the
    shape its API expects."""

    def __init__(self, backend: RerankBackend, metrics: ServiceMetrics, model: ModelThread) -> None:
        self.backend, self.settings, self.metrics, self.model = backend, backend.settings, metrics, model

    def check_query(self, query: str) -> None:
        if len(query) > self.settings.max_query_chars:
            raise ApiError(
                413,
                f"query has {len(query)} characters; the limit is {self.settings.max_query_chars}",
                "query_too_long",
            )


def server_timing(seconds: dict[str, float], total: float) -> str:
    items = [f"{k};dur={v * 1e3:.3f}" for k, v in seconds.items() if v > 0]
    return ", ".join([*items, f"total;dur={total * 1e3:.3f}"])
