# The real HTTP server (api/server.py: uvicorn, httptools or h11) in a thread of the test
# process: a client that never finishes its headers, or drips them, is disconnected; a kept-alive
# connection idle past the header deadline still serves its next request (clients reuse pooled
# connections for 5 s) and is closed after the keep-alive; a body that stalls is answered 408 and
# disconnected; the metrics listener serves /metrics without a key and nothing else.
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from api.main import create_app
from api.server import listeners
from tests.api.conftest import SETTINGS
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    port: int
    metrics_port: int

    def url(self, path: str, port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.port}{path}"


@pytest.fixture(scope="module")
def served(services) -> Iterator[Served]:
    settings = SETTINGS.model_copy(
        update={
            "port": free_port(),
            "metrics_port": free_port(),
            "header_timeout_s": HEADER_TIMEOUT_S,
            "body_timeout_s": BODY_TIMEOUT_S,
            "keep_alive_s": KEEP_ALIVE_S,
        }
    )
    app = create_app(settings, services.redis_url, services.database_url)
    config, sockets = listeners(app, settings)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the server to start")
    yield Served(settings.port, settings.metrics_port)
    server.should_exit = True
    thread.join(timeout=15)
    assert not thread.is_alive(), "the server did not stop"


def connect(served: Served) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    sock.settimeout(10)  # a generous bound on every read: the deadlines are ~1 s
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):  # b"" once the server closed the connection
        received += chunk
    return received


def test_unfinished_headers_are_disconnected(served):
    with connect(served) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
        assert read_until_closed(sock) == b""
    assert httpx.get(served.url("/health")).status_code == 200  # the server itself is fine


def test_headers_dripped_byte_by_byte_are_disconnected(served):
    # Each byte resets uvicorn's idle timer; the deadline counts from the connection.
    with connect(served) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        deadline = time.monotonic() + 20 * HEADER_TIMEOUT_S
        with pytest.raises(OSError):  # the server closes; a later send fails
            while time.monotonic() < deadline:
                sock.sendall(b"X")
                time.sleep(0.05)
        assert time.monotonic() < deadline, "still connected long after the header deadline"


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def read_response(sock: socket.socket) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received or not received.endswith(b"}"):  # /health's JSON body
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-response: {received!r}"
        received += chunk
    return received


def test_a_kept_alive_connection_outlives_the_header_deadline_then_the_keep_alive_closes_it(served):
    with connect(served) as sock:
        sock.sendall(HEALTH)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        # Idle between requests is the keep-alive's, not the header deadline's: a pooled
        # connection reused after 2.5 header deadlines is served.
        time.sleep(2.5 * HEADER_TIMEOUT_S)
        sock.sendall(HEALTH)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        sock.settimeout(6 * KEEP_ALIVE_S)
        assert read_until_closed(sock) == b""
        assert time.monotonic() - idle_from >= 0.9 * KEEP_ALIVE_S


def test_headers_dripped_on_a_kept_alive_connection_are_disconnected(served):
    with connect(served) as sock:
        sock.sendall(HEALTH)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # the deadline counts from this first byte
        deadline = time.monotonic() + 0.8 * KEEP_ALIVE_S  # closed by the deadline, not idleness
        with pytest.raises(OSError):
            while time.monotonic() < deadline:
                sock.sendall(b"X")
                time.sleep(0.05)
        assert time.monotonic() < deadline, "still connected long after the header deadline"


def test_a_stalled_body_is_answered_408_and_disconnected(served):
    with connect(served) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer flm-whoever\r\nContent-Length: 1000\r\n\r\n"
            b'{"model": '
        )
        response = read_until_closed(sock)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), response
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_the_metrics_listener_serves_only_metrics_without_a_key(served):
    scraped = httpx.get(served.url("/metrics", served.metrics_port))
    assert scraped.status_code == 200 and "fleetlm:queue_depth" in scraped.text
    elsewhere = httpx.get(served.url("/v1/models", served.metrics_port))
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["code"] == "not_found"
    assert httpx.get(served.url("/metrics")).status_code == 401  # the API port: a key needed
