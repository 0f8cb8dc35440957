# A streaming client that hangs up is noticed within a chunk or two even when the body has a
# burst of chunks ready and never waits on anything else: the real HTTP server (api/server.py's
# protocol, httptools or h11) marks the request's Peer gone the moment the connection is lost,
# and the body yields to the event loop once per chunk (api/generation.py does the same). This
# is what bills a hang-up the tokens its client got.
from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from api.server import bind_listeners, uvicorn_config
from api.sse import EventStreamResponse, Peer, attach_peer
from service.settings import Settings
from tests.api.test_server_limits import free_port
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

BURST = 1_000_000  # chunks the body would send if nothing stopped it


class Recorder:
    def __init__(self) -> None:
        self.sent_at: list[float] = []  # monotonic time of every chunk the body handed over
        self.done = threading.Event()


def make_app(rec: Recorder) -> Starlette:
    async def body(peer: Peer) -> AsyncIterator[str]:
        # A burst: a chunk ready every time the response asks, never waiting on anything but
        # the one turn of the loop per chunk (as api/generation.py does).
        try:
            for i in range(BURST):
                yield f"data: {i}\n\n"
                rec.sent_at.append(time.monotonic())
                await asyncio.sleep(0)
                if peer.gone:
                    break
        finally:
            rec.done.set()

    async def stream(request: Request) -> EventStreamResponse:
        peer = attach_peer(request.scope)
        return EventStreamResponse(body(peer), peer, {})

    return Starlette(routes=[Route("/stream", stream)])


def test_a_hang_up_during_a_burst_stops_the_stream_within_a_few_chunks():
    rec = Recorder()
    settings = Settings(_env_file=None, port=free_port())
    config = uvicorn_config(make_app(rec), settings, settings.port)
    server = uvicorn.Server(config)
    sockets = bind_listeners(settings)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the server to start")
        with socket.create_connection(("127.0.0.1", settings.port), timeout=10) as sock:
            sock.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            while b"data: 100\n" not in received:
                received += sock.recv(65536)
            closed_at = time.monotonic()
        assert rec.done.wait(30), "the body ran on after the hang-up"
        after = sum(t > closed_at for t in rec.sent_at)
        # A chunk or two may be handed over before the close reaches the server; a body that
        # ran on would send all BURST of them.
        assert len(rec.sent_at) < BURST and after <= 16, (len(rec.sent_at), after)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
