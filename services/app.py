"""The FastAPI app: routes, limits, auth, request ids, access logs, metrics; model work on one thread.

Requests are validated on the event loop, then queued for the single model thread (the ranker is not
thread-safe and a CPU or GPU gains nothing from two forward passes at once). At most ``max_queue`` requests
wait for or hold the model; the next one gets 503 with ``Retry-After`` instead of a queue that grows
without limit.

Where each part lives (docs/architecture.md, "Where a new thing goes"):

- this module: :func:`create_app`, the wiring and the lifespan;
- services/gate.py: the ASGI middleware every request passes first (request id, access log, framing,
  Content-Type, API key, body size and timeout, JSON shape); services/auth.py: the Bearer-key check;
- services/errors.py: :class:`ApiError` and the JSON error handlers; services/shapes.py: the paths and the
  shape each takes;
- services/modelthread.py: the model thread, the queue, deadlines, disconnects and the shutdown drain;
- services/native.py: POST /v1/rerank; services/compat.py: the Cohere / Jina / Voyage / TEI / vLLM /
  Infinity shapes; services/handlers.py: what the two share;
- services/ops.py: /health, /ready, /metrics, /v1/info.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from aheadrank.services.auth import key_check
from aheadrank.services.backend import RerankBackend
from aheadrank.services.compat import TextsHandler, compat_routes
from aheadrank.services.errors import install_error_handlers
from aheadrank.services.gate import Gate
from aheadrank.services.jsonguard import max_values
from aheadrank.services.metrics import ServiceMetrics
from aheadrank.services.modelthread import Drain, ModelThread
from aheadrank.services.native import NativeHandler, native_routes
from aheadrank.services.ops import ops_routes
from fastapi import FastAPI

from aheadrank import __version__

__all__ = ["ModelThread", "create_app"]


def create_app(backend: RerankBackend) -> FastAPI:
    """One app around a loaded (and warmed-up) backend."""
    settings = backend.settings
    metrics = ServiceMetrics()
    metrics.info.labels(
        backend.model_name, backend.ranker.kind, backend.ranker.fingerprint, backend.device
    ).set(1)
    drain = Drain()
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
    install_error_handlers(app, metrics)
    require_key = key_check(settings.api_keys)
    ops_routes(app, backend, metrics, drain, require_key)
    texts = TextsHandler(backend, metrics, model)
    native_routes(app, NativeHandler(backend, metrics, model), texts, require_key)
    compat_routes(app, texts, require_key)
    return app
