# The HTTP server around the app (`fleetlm api`): uvicorn on httptools (h11 where httptools is
# not installed) and uvloop (uvicorn's "auto" loop) with a header deadline, the API port and, when
# metrics_port is set, a second listener for the scraper; SIGTERM drains first. At load the
# API process spends its time per relayed token in the HTTP layer: httptools writes a chunk with
# a few C calls where h11 runs its state machine in Python.
from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from api.sse import mark_gone
from service.settings import Settings

LISTEN_BACKLOG = 2048  # uvicorn's default


def http_protocol_base() -> type[asyncio.Protocol]:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed
        return H11Protocol
    return HttpToolsProtocol


class HeaderDeadline:
    """Mixed into uvicorn's HTTP protocol (h11 or httptools: both keep `cycle`, `transport`,
    `loop` and call `data_received` and `on_response_complete`): closes a connection whose request
    line and headers have not all arrived within `header_timeout_s` of the connection opening, or
    of the first byte of the next request on a kept-alive connection (uvicorn's keep-alive timer
    stops at the first byte, so a client dripping header bytes would otherwise hold the connection
    forever). A kept-alive connection with no bytes at all is uvicorn's keep-alive timer's
    (`keep_alive_s`): it must outlast the clients' own idle expiry (httpx and the openai SDK drop
    a pooled connection after 5 s), or a client reusing one just as the server closes it gets
    "server disconnected" for a request that was never read. Bodies have their own deadline
    (api/body_limits.py)."""

    header_timeout_s = 10.0
    _deadline: asyncio.TimerHandle | None = None
    _between_requests = False  # a response went out and no byte of the next request came yet
    cycle: Any
    transport: Any
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self._between_requests:
            self._between_requests = False
            self._arm_header_deadline()
        super().data_received(data)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._between_requests = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self.cycle is not None and not self.cycle.response_complete:
            mark_gone(self.cycle.scope)  # a stream sees it at its next chunk (api/sse.py)
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm_header_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if not self.transport.is_closing():
            cycle = self.cycle
            self._deadline = self.loop.call_later(self.header_timeout_s, self._expire, cycle)

    def _expire(self, cycle: Any) -> None:
        # Still the cycle it was armed with, and no request in flight: we are waiting for headers.
        idle = cycle is None or cycle.response_complete
        if self.cycle is cycle and idle and not self.transport.is_closing():
            self.transport.close()


def protocol_for(settings: Settings) -> type[asyncio.Protocol]:
    return type(
        "HeaderDeadlineProtocol",
        (HeaderDeadline, http_protocol_base()),
        {"header_timeout_s": settings.header_timeout_s},
    )


def uvicorn_config(app: FastAPI, settings: Settings, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=port,
        http=protocol_for(settings),
        log_level="warning",
        log_config=None,
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=5,
    )


def bind_listeners(settings: Settings) -> list[socket.socket]:
    """The API port's socket, then the metrics port's if set: bound and listening, inheritable,
    so `fleetlm serve` can bind them once and hand them to each of its API processes."""
    if settings.metrics_port and settings.metrics_port == settings.port:
        raise ValueError("FLEETLM_METRICS_PORT must differ from FLEETLM_PORT")
    sockets: list[socket.socket] = []
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        for port in [settings.port] + ([settings.metrics_port] if settings.metrics_port else []):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((settings.host, port))  # OSError when taken (uvicorn's own bind would exit)
            sock.listen(LISTEN_BACKLOG)  # from now on, not from the first API process's start
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def listeners(
    app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None
) -> tuple[uvicorn.Config, list[socket.socket]]:
    """The server's config and its sockets (the given ones: inherited from `fleetlm serve`)."""
    return uvicorn_config(app, settings, settings.port), sockets or bind_listeners(settings)


def serve(app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None) -> None:
    class DrainingServer(uvicorn.Server):
        # First SIGTERM/SIGINT: drain (api/drain.py), then exit as uvicorn does; a second: now.
        def handle_exit(self, sig: int, frame: object) -> None:
            drain = app.state.drain
            if drain.draining:
                super().handle_exit(sig, frame)  # type: ignore[arg-type]
            else:
                drain.start(lambda: super(DrainingServer, self).handle_exit(sig, None))

    config, sockets = listeners(app, settings, sockets)
    DrainingServer(config).run(sockets=sockets)
