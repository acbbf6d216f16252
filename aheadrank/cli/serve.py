"""``aheadrank serve``: load, check, warm up, then serve (uvicorn). Every flag has an ``AHEADRANK_*`` twin."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import env, opt, settings_block, user_errors, with_options
from aheadrank.errors import AheadrankError
from aheadrank.services.settings import ServiceSettings


class JsonLines(logging.Formatter):
    """One JSON object per log line: structured and greppable."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        try:
            body = json.loads(message) if message.startswith("{") else {"message": message}
        except ValueError:
            body = {"message": message}
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            **body,
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _checked_level(value: str) -> str:
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(LOG_LEVELS)}")
    return value.lower()


def configure_logging(level: str) -> None:
    from aheadrank.logs import CurrentStderr

    handler = CurrentStderr()
    handler.setFormatter(JsonLines())
    for name in ("aheadrank", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
    logging.getLogger("aheadrank").setLevel(level.upper())  # uvicorn.error: uvicorn.Config(log_level=...)


def settings_problems(exc) -> str:
    """A pydantic ValidationError of ServiceSettings as one line naming each flag and its variable (pydantic's
    own text is several lines, names the field and links to its website)."""
    parts = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err.get("loc") else ""
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if field:
            name = f"--{field.replace('_', '-')} ({env(field.replace('_', '-'))})"
            given = "" if field == "api_keys" else f" {err.get('input')!r}"  # keys are secrets
            parts.append(f"{name}{given}: {message}")
        else:
            parts.append(message)
    return "; ".join(parts)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (as uvicorn binds one: SO_REUSEADDR, IPv6 for a host with ':'), for
    uvicorn to listen on; a port in use or an address this machine lacks is one line."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = (
            " (another server is there: choose another --port / AHEADRANK_PORT)"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise AheadrankError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    return sock


def graceful_server(config):
    """uvicorn's server, except that SIGINT/SIGTERM end it with exit code 0 after the graceful shutdown
    (uvicorn re-raises the signal, which would skip closing the store and the searcher)."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            begin_drain = getattr(getattr(self.config.app, "state", None), "begin_drain", None)
            if begin_drain is not None:  # waiting requests: 503 now, not cancelled at the grace period's end
                begin_drain()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

    return _Server(config)


# every service setting but the keys is a flag, declared once: by its ServiceSettings field (default,
# bounds, help) and mirrored by AHEADRANK_<FIELD>, as the settings model reads it
SERVICE_OPTIONS = settings_block(
    "service",
    ServiceSettings,
    [name for name in ServiceSettings.model_fields if name not in ("api_keys", "api_keys_file")],
    checkpoint={"default": None},  # or from a build directory (`aheadrank serve DIR`)
)


def from_build(build_dir: Path | None, service: dict) -> dict:
    """The settings with the checkpoint, store and index of an ``aheadrank build`` directory filled in where
    the flags did not give them."""
    if build_dir is None:
        if service.get("checkpoint") is None:
            raise AheadrankError("give a build directory (aheadrank serve DIR) or --checkpoint")
        return service
    from aheadrank.build import BUILD_FILE, paths, read_record

    record = read_record(build_dir)
    if record is None:
        raise AheadrankError(
            f"{build_dir} is not a build directory ({BUILD_FILE} missing): see `aheadrank build`"
        )
    missing = record.stages_left()
    if missing:
        raise AheadrankError(
            f"{build_dir}: the build has not finished (stages left: {', '.join(missing)}); run the same "
            "`aheadrank build` command again to resume it"
        )
    p = paths(build_dir)
    filled = {"checkpoint": p["checkpoint"], "store": p["store"], "index": p["lucene"]}
    return {**service, **{k: v for k, v in filled.items() if service.get(k) is None}}


@app.command("serve")
@user_errors
@with_options(SERVICE_OPTIONS)
def serve(
    ctx: typer.Context,
    build_dir: Path | None = typer.Argument(
        None, help="a directory made by `aheadrank build` (its checkpoint, store and BM25 index)"
    ),
    api_key: list[str] = typer.Option(
        [],
        "--api-key",
        envvar=[env("api-key"), env("api-keys")],
        help="accepted Bearer key (repeat; env AHEADRANK_API_KEY or AHEADRANK_API_KEYS: comma- or space-separated). "
        "On the command line, `ps` shows it: prefer the environment or --api-keys-file",
    ),
    api_keys_file: Path | None = opt(
        None,
        "--api-keys-file",
        help="file of accepted Bearer keys (whitespace- or comma-separated, one or more a line; '#' comments)",
    ),
    log_level: str = opt(
        "info", "--log-level", callback=_checked_level, help="debug, info, warning, error or critical"
    ),
    *,
    service: dict,
) -> None:
    """Serve re-ranking over HTTP: /v1/rerank (native; Cohere v1/Jina/Voyage), /v2/rerank (Cohere v2), /rerank
    (TEI, vLLM), /infinity/rerank, /health, /ready, /metrics, /v1/info."""
    import uvicorn
    from pydantic import ValidationError

    from aheadrank.services.app import create_app
    from aheadrank.services.backend import RerankBackend
    from aheadrank.services.keys import service_keys
    from aheadrank.services.limits import connection_cap, guarded_h11

    configure_logging(log_level)
    log = logging.getLogger("aheadrank.service")
    on_command_line = getattr(ctx.get_parameter_source("api_key"), "name", "") == "COMMANDLINE"
    keys = service_keys(api_key if on_command_line else [], api_keys_file, dict(os.environ))
    if api_key and on_command_line:
        message = (
            "--api-key on the command line is visible to every user of this machine (ps, /proc/<pid>/cmdline): "
            "give keys in AHEADRANK_API_KEYS or a file (--api-keys-file / AHEADRANK_API_KEYS_FILE)"
        )
        print(f"warning: {message}", file=sys.stderr)
        log.warning(message)
    service = from_build(build_dir, service)
    try:  # api_keys_file=None: the flag's file (or AHEADRANK_API_KEYS_FILE's) is read above, not again
        settings = ServiceSettings(**service, api_keys=keys, api_keys_file=None)
    except ValidationError as exc:  # a bound the flags do not check themselves (e.g. a timeout > 0)
        raise AheadrankError(settings_problems(exc)) from None
    host, port = settings.host, settings.port
    if not settings.api_keys and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(json.dumps({"event": "no_auth", "message": f"serving on {host} without API keys"}))
    # the port first: a busy one is one line now, not after the model's load and warm-up (it logged "ready",
    # then uvicorn's traceback-free "address already in use" and exit code 3)
    sock = listening_socket(host, port)
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    t0 = time.perf_counter()
    try:
        backend = RerankBackend.load(settings)
    except BaseException:
        sock.close()
        raise
    backend.watch()  # a shard (dense/ too) truncated or rewritten while served: refused, never read (SIGBUS)
    if settings.verify_store == "start":
        backend.verify_at_start()  # every shard's sha256 before serving: a mismatch refuses to start
    if settings.warmup:
        backend.warmup()
    else:
        backend.ready = True
    log.info(
        json.dumps(
            {
                "event": "ready",
                "model": backend.model_name,
                "device": backend.device,
                "store_docs": len(backend.reader) if backend.reader is not None else None,
                "startup_s": round(time.perf_counter() - t0, 2),
                "url": f"http://{host}:{port}",
            }
        )
    )
    config = uvicorn.Config(
        create_app(backend),
        host=host,
        port=port,
        access_log=False,
        log_config=None,
        log_level=log_level.lower(),
        timeout_graceful_shutdown=10,
        http=guarded_h11(
            settings.read_timeout, connection_cap(settings.max_connections), settings.send_timeout
        ),
    )
    try:
        graceful_server(config).run(sockets=[sock])
    finally:
        sock.close()
        backend.close()
        log.info(json.dumps({"event": "stopped"}))
