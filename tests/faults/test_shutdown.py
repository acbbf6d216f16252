"""Shutdown with a request on the model thread (issue 37, item 9): SIGTERM or SIGINT answers it within the
grace with a JSON 503 (``shutting_down``, ``Retry-After``) instead of waiting for its deadline, and the
server exits 0. A real `aheadrank serve` on 127.0.0.1; the request is sized to run far past the grace."""

from __future__ import annotations

import os
import signal
import threading
import time

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import httpx
import pytest
from faults_testkit import wait_for
from services_testkit import Server

pytestmark = pytest.mark.slow
GRACE_S = 10.0  # uvicorn's timeout_graceful_shutdown in aheadrank/cli/serve.py


def _queue_depth(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(x for x in text.splitlines() if x.startswith("aheadrank_queue_depth ")).split()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_running_request_is_answered_503_within_the_grace(service_env, sig):
    server = Server(
        "--checkpoint", str(service_env.checkpoint), "--no-access-log", "--no-warmup",
        "--doc-batch-size", "1", "--max-documents", "60000", "--request-timeout-s", "300",
    ).wait_ready()  # fmt: skip
    letters = "abcdefghijklmnopqrstuvwxyz"  # one word piece each: ~120 pieces in 240 bytes a text
    # distinct texts (a number each): equal texts are split and scored once
    docs = [" ".join(letters[(i + j) % 26] for j in range(120)) + f" {i}" for i in range(60_000)]
    result: dict = {}

    def one() -> None:
        try:
            r = httpx.post(server.url + "/rerank", json={"query": "tumour", "texts": docs}, timeout=400)
            result.update(status=r.status_code, headers=r.headers, text=r.text, at=time.monotonic())
        except httpx.HTTPError as exc:
            result.update(status="error", text=repr(exc), at=time.monotonic())

    thread = threading.Thread(target=one)
    thread.start()
    try:
        assert wait_for(lambda: _queue_depth(server.url) >= 1, timeout=60, step=0.1)
        time.sleep(1.0)  # on the model thread, scoring one text per chunk
        assert thread.is_alive(), result  # still running: it needs far longer than the grace
        sent = time.monotonic()
        os.kill(server.pid, sig)
        thread.join(timeout=120)
        try:
            server.proc.wait(60)
        except Exception:
            pass
    finally:
        code = server.stop()
    assert result.get("status") == 503, result
    assert result["headers"]["content-type"].startswith("application/json"), result
    assert result["headers"].get("retry-after") == "1"
    assert '"kind":"shutting_down"' in result["text"], result["text"][:300]
    assert result["at"] - sent < GRACE_S, result["at"] - sent  # not the request's 300 s deadline
    assert code == 0, server.log_tail(30)
    assert "Traceback" not in server.output(), server.log_tail(30)
