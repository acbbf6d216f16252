"""HTTP framing and routing edges of the real server (uvicorn + h11, as `aheadrank serve` runs it; issue 37,
item 10): ambiguous framing is refused and the connection closed (no request smuggled in a body is
answered), a trailing slash is 404 and never a redirect built from the client's Host header, HEAD on the
probes answers like GET. Raw sockets on 127.0.0.1, bounded reads."""

from __future__ import annotations

import socket

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import pytest
from services_testkit import Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(service_env):
    s = Server("--checkpoint", str(service_env.checkpoint), "--no-access-log", "--no-warmup").wait_ready()
    yield s
    assert s.stop() == 0


def _exchange(server, raw: bytes, timeout: float = 5.0) -> bytes:
    """Send ``raw``, read until the server closes the connection (or ``timeout`` passes with nothing more)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(raw)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            out += b"<open>"  # still open after the timeout: the server kept reading this connection
        return out


@pytest.mark.parametrize(
    ("te", "length_of"),
    [("chunked", "body"), ("CHUNKED", "zero"), ("gzip, chunked", "body"), ("chunked", "first")],
)
def test_content_length_with_transfer_encoding_is_refused_and_closed(server, te, length_of):
    smuggled = b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    body = b"0\r\n\r\n" + smuggled
    length = {"body": len(body), "zero": 0, "first": 5}[length_of]
    head = (
        f"POST /v2/rerank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nTransfer-Encoding: {te}\r\n\r\n"
    ).encode()
    out = _exchange(server, head + body)
    assert out.count(b"HTTP/1.1 ") == 1, out  # one answer: the smuggled GET /ready is never read
    assert out.startswith(b"HTTP/1.1 400") or out.startswith(b"HTTP/1.1 501"), out
    assert not out.endswith(b"<open>"), out
    assert b'"status":"ready"' not in out


@pytest.mark.parametrize("path", ["/health/", "/ready/", "/v1/rerank/", "/metrics/"])
def test_a_trailing_slash_is_not_redirected_to_the_clients_host(server, path):
    method = "POST" if "rerank" in path else "GET"
    raw = (
        f"{method} {path} HTTP/1.1\r\nHost: attacker.invalid:8443\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    ).encode()
    out = _exchange(server, raw)
    head = out.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 404"), out
    assert b"location:" not in head and b"attacker.invalid" not in out


@pytest.mark.parametrize("path", ["/health", "/ready"])
def test_head_on_the_probes_answers_200_without_a_body(server, path):
    raw = f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    out = _exchange(server, raw)
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out
    assert rest == b"", out
