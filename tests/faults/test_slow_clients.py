"""Slow and greedy clients against a real `aheadrank serve` on 127.0.0.1 (issue 37, items 6 and 7): a refused
request costs no body buffer, a trickled body is answered 408, a client that never reads its response is
dropped, and a small request is not held behind a large one. Raw sockets where the HTTP client would hide the
fault; bounded loops; no timing thresholds (ordering, status lines, closed connections, descriptor counts and
a generous memory bound)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import httpx
import pytest
from faults_testkit import wait_for
from services_testkit import Server

pytestmark = pytest.mark.slow

KEY = "k-slow-clients-7"


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _head(path: str, length: int, key: str | None) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _answer(s: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the connection (or ``timeout`` passes)."""
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


@pytest.fixture(scope="module")
def server(service_env):
    # the new limits through their environment twins: a server that ignores them fails the tests below
    env = {
        "AHEADRANK_API_KEYS": KEY,
        "AHEADRANK_BODY_TIMEOUT": "2",
        "AHEADRANK_SEND_TIMEOUT": "1.5",
    }
    srv = Server(
        "--checkpoint", str(service_env.checkpoint), "--store", str(service_env.store), "--no-access-log",
        "--read-timeout", "6", "--max-documents", "4000", "--doc-batch-size", "8",
        "--request-timeout-s", "120", env=env,
    ).wait_ready()  # fmt: skip
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.output(), srv.log_tail(40)


@pytest.mark.parametrize(("path", "key", "status"), [("/v2/rerank", None, 401), ("/rerank", "wrong", 403)])
def test_refused_from_the_headers_before_the_body(server, path, key, status):
    """A key refusal is answered as soon as the head is in, with the body still unsent, and the connection
    is closed: no body is waited for or buffered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(_head(path, 3_000_000, key))  # a 3 MB body announced, never sent
        answer = _answer(s, timeout=4)  # below the read timeout: a server waiting for the body says nothing
    assert answer.startswith(f"HTTP/1.1 {status}".encode()), answer[:200]
    assert b"connection: close" in answer.lower()


def test_unauthenticated_uploads_hold_no_memory(server):
    """Fourteen clients with a bad key each push 5 MB of a 6 MB body and hold the connection: the server's
    memory must not grow by the bodies (it would by ~70 MB if it buffered them before the key check)."""
    socks = []
    before = _rss_mb(server.pid)
    chunk = b" " * 65536
    try:
        for i in range(14):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(_head("/v1/rerank", 6_000_000, None if i % 2 else "nope"))
            s.settimeout(0.5)
            try:
                for _ in range(80):  # 5 MB, or until the server stops taking it
                    s.sendall(chunk)
            except OSError:
                pass
            socks.append(s)
        time.sleep(1.0)
        grown = _rss_mb(server.pid) - before
    finally:
        for s in socks:
            s.close()
    assert grown < 35, f"RSS grew {grown:.0f} MB for 70 MB of refused bodies"
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("gap", [0.3, 0.7])
def test_trickled_body_gets_408(server, gap):
    """An authenticated body that keeps arriving (each piece well within the read timeout) but not as a
    whole within --body-timeout is answered 408 and the connection closed."""
    body = json.dumps({"query": "gene expression", "documents": ["a cell", "a tumour"]}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(_head("/v2/rerank", len(body), KEY))
        answer = b""
        s.settimeout(gap)
        for i in range(len(body) - 1):  # one byte at a time, never the last one
            try:
                s.sendall(body[i : i + 1])
                answer += s.recv(65536)
                if answer:
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        answer += _answer(s, timeout=4)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b'"kind":"body_timeout"' in answer and b"connection: close" in answer.lower()


def test_clients_that_never_read_are_dropped(server):
    """Six clients that send a request with a ~12 MB answer (the documents returned) and never read it, with a
    tiny receive buffer: the server drops them and frees their descriptors; others are served meanwhile."""
    docs = [("protein folding " * 2500)[:40_000] for _ in range(150)]
    body = json.dumps({"query": "protein", "documents": docs, "return_documents": True}).encode()
    base = _sockets(server.pid)
    socks = []
    try:
        for _ in range(6):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", server.port))
            s.sendall(_head("/v1/rerank", len(body), KEY) + body)
            socks.append(s)
        assert wait_for(lambda: _sockets(server.pid) >= base + 6, timeout=30)
        # answered and never read: the connections must go, not wait for a flush forever
        assert wait_for(lambda: _sockets(server.pid) <= base, timeout=45, step=0.5), (
            _sockets(server.pid),
            base,
        )
        r = httpx.post(
            server.url + "/v2/rerank",
            json={"query": "protein", "documents": ["a protein", "a cell"]},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        for s in socks:
            s.close()


def test_small_requests_are_not_held_behind_a_large_one(server):
    """While a request of 3,000 ad-hoc documents runs (375 chunks of 8), a native request over stored
    candidates and a two-document request sent after it both finish before it."""
    headers = {"Authorization": f"Bearer {KEY}"}
    words = "cell protein gene tumour risk dose trial therapy signal".split()
    # distinct texts (a number each): equal texts are split and scored once
    big = [" ".join(words[(i + j) % len(words)] for j in range(40)) + f" {i}" for i in range(3000)]
    finished: list[str] = []
    lock = threading.Lock()

    def post(name: str, path: str, body: dict) -> None:
        r = httpx.post(server.url + path, json=body, headers=headers, timeout=120)
        with lock:
            finished.append(f"{name}:{r.status_code}")

    def running() -> bool:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        line = next(x for x in text.splitlines() if x.startswith("aheadrank_queue_depth "))
        return float(line.split()[1]) >= 1

    docids = [json.loads(x)["_id"] for x in open(server_sample_corpus()).readlines()[:4]]
    large = threading.Thread(target=post, args=("large", "/rerank", {"query": "gene", "texts": big}))
    large.start()
    assert wait_for(running, timeout=60, step=0.02)
    smalls = [
        threading.Thread(target=post, args=("native", "/v1/rerank", {"query": "gene", "candidates": docids})),
        threading.Thread(target=post, args=("docs", "/v2/rerank", {"query": "gene", "documents": big[:2]})),
    ]
    for t in smalls:
        t.start()
    for t in [*smalls, large]:
        t.join(timeout=150)
    assert len(finished) == 3 and all(x.endswith(":200") for x in finished), finished
    assert finished[-1] == "large:200", finished


def server_sample_corpus():
    from services_testkit import SAMPLE

    return SAMPLE / "corpus.jsonl"
