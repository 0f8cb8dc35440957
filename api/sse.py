# Server-sent events for the streaming endpoints: the event text, a per-request template for the
# content chunks (the hot path: one per generated token), and the response that tells the stream
# when its client has gone.
#
# Per relayed token the API used to build the chunk dict, JSON-encode all of it and ask Starlette
# whether the client was still there (a cancelled receive under a fresh cancel scope, ~15 % of
# the API process's CPU at load). The template encodes only the text; the disconnect is a flag
# (`Peer`) kept in the request's ASGI scope, which our HTTP protocol sets the moment the
# connection is lost (api/server.py) and the response's disconnect listener sets too (any
# other server). The stream yields to the event loop once per chunk before reading it, so a
# hang-up is noticed within a chunk or two even when the relay has a burst of tokens ready.
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

_MARK = "\x00fleetlm-text\x00"  # no request id, model name or finish reason contains a NUL
_QUOTED_MARK = json.dumps(_MARK)


def sse(obj: dict[str, Any] | str) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n"


class ChunkTemplate:
    """The SSE event of a content chunk, for one request: everything but the text encoded once.
    `event(text)` equals `sse(chunk(text))` byte for byte."""

    __slots__ = ("head", "tail")

    def __init__(self, chunk: Callable[[str], dict[str, Any]]) -> None:
        # chunk(text): the request's content chunk, the same but for the text
        head, _, tail = sse(chunk(_MARK)).partition(_QUOTED_MARK)
        if not tail or _QUOTED_MARK in tail:
            raise ValueError("the chunk must hold its text exactly once")
        self.head, self.tail = head, tail

    def event(self, text: str) -> str:
        return self.head + json.dumps(text) + self.tail


PEER_SCOPE_KEY = "fleetlm.peer"


@dataclass(slots=True)
class Peer:
    """The streaming client, as the response sees it: `gone` once its disconnect arrived."""

    gone: bool = False


def attach_peer(scope: MutableMapping[str, Any]) -> Peer:
    """The request's Peer, kept in its scope (the dict the HTTP protocol's cycle holds too)."""
    peer = scope.get(PEER_SCOPE_KEY)
    if peer is None:
        peer = scope[PEER_SCOPE_KEY] = Peer()
    return peer


def mark_gone(scope: Mapping[str, Any] | None) -> None:
    """Called by the HTTP protocol when the connection is lost."""
    peer = scope.get(PEER_SCOPE_KEY) if scope is not None else None
    if peer is not None:
        peer.gone = True


class EventStreamResponse(StreamingResponse):
    """text/event-stream whose body can ask `peer.gone` after each chunk instead of awaiting a
    receive: Starlette's disconnect listener already waits on one for the whole response."""

    def __init__(
        self,
        content: Any,
        peer: Peer,
        headers: dict[str, str],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.peer = peer
        self.on_close = on_close  # called once the response is over, even if the body never ran

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.on_close is not None:
                self.on_close()

    async def listen_for_disconnect(self, receive: Receive) -> None:
        try:
            await super().listen_for_disconnect(receive)
        finally:
            self.peer.gone = True
