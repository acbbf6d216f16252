"""The operations endpoints: /health, /ready (with the store's leases and verification), /metrics, /v1/info."""

from __future__ import annotations

from collections.abc import Callable

from aheadrank.services.backend import RerankBackend
from aheadrank.services.errors import ERRORS, error_response
from aheadrank.services.metrics import ServiceMetrics
from aheadrank.services.modelthread import Drain
from aheadrank.services.schemas import ErrorResponse, InfoResponse
from fastapi import Depends, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST


def _store_status(backend: RerankBackend, metrics: ServiceMetrics) -> tuple[dict | None, dict[str, str]]:
    """/ready's ``store`` (its file leases, ``held`` / ``none``, and how far the sha256 verification got) and
    the damaged shards; sets the store's gauges, which /ready and /metrics both refresh (a Prometheus that
    never probes /ready read 0 for leased and verified)."""
    damaged = backend.check_shards()
    metrics.damaged_shards.set(len(damaged))
    if not backend.readers():
        return None, damaged
    verification = backend.verification().status()
    lease = backend.lease_state()
    total = verification["bytes_total"]
    metrics.store_verified.set(verification["bytes_done"] / total if total else 1.0)
    if lease is not None:
        metrics.store_leased.set(1 if lease == "held" else 0)
    keys = ("mode", "state", "shards_done", "shards_total", "bytes_done", "bytes_total")
    return {"lease": lease, "verification": {k: verification[k] for k in keys}}, damaged


def ops_routes(
    app: FastAPI, backend: RerankBackend, metrics: ServiceMetrics, drain: Drain, require_key: Callable
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
            return error_response(None, 503, "warming up", "not_ready")
        if drain.on:
            return error_response(None, 503, "shutting down", "shutting_down")
        store, damaged = _store_status(backend, metrics)
        if damaged:
            problems = "; ".join(f"{file}: {why}" for file, why in damaged.items())
            return error_response(
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
        _store_status(backend, metrics)
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

    # every GET answers HEAD alike (the headers, no body): load balancers and curl -I probe with it
    app.add_api_route("/metrics", prometheus, methods=["HEAD"], include_in_schema=False)
    app.add_api_route(
        "/v1/info", info, methods=["HEAD"], include_in_schema=False, dependencies=[Depends(require_key)]
    )
