# The shared flow of a generation endpoint: enqueue, then relay the output stream as SSE or
# collect it into one response. A client that goes away (stream or not) publishes a cancel.
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api.drain import Drain
from api.metrics import ADMISSIONS, REJECTIONS
from api.relay import relay_events
from api.state import AppState
from metering.keys import Principal
from service.admission import enqueue, publish_cancel
from service.errors import APIError, event_error
from service.events import FINAL_EVENTS
from service.limits import release, reserve
from service.logging_setup import request_id_var
from service.queued_request import QueuedRequest
from service.schemas.chunk_usage import ChunkUsage
from service.schemas.formatter import Formatter
from service.schemas.sampling import Usage

log = logging.getLogger("fleetlm.api")


def sse(obj: dict[str, Any] | str) -> str:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n"


async def generate(
    request: Request,
    state: AppState,
    queued: QueuedRequest,
    fmt: Formatter,
    *,
    stream: bool,
    include_usage: bool,
    principal: Principal,
    continuous_usage: bool = False,
) -> Response:
    request_id_var.set(queued.request_id)
    drain = request.app.state.drain
    tenant = principal.tenant_name
    # Drain, limits (429 with x-ratelimit-* headers), then the queue; all before any byte.
    try:
        drain.check()
        headers = await reserve(state, principal, queued)
        try:
            await enqueue(state.redis, state, queued)
        except APIError:
            await release(state, queued)
            raise
    except APIError as exc:
        reason = exc.type if exc.status == 429 else (exc.code or exc.type)
        REJECTIONS.labels(tenant, queued.priority, str(exc.status), reason).inc()
        raise
    ADMISSIONS.labels(tenant, queued.priority).inc()
    log.info(
        "request admitted",
        extra={
            "tenant": tenant,
            "priority": queued.priority,
            "prompt_tokens": len(queued.prompt_token_ids),
        },
    )
    headers["x-request-id"] = queued.request_id
    if stream:
        usage = ChunkUsage(include_usage, continuous_usage, len(queued.prompt_token_ids))
        body = _stream(state, queued.request_id, fmt, usage, drain)
        headers["cache-control"] = "no-cache"
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)
    drain.opened()
    try:
        return await _collect(request, state, queued.request_id, fmt, headers)
    finally:
        drain.closed()


async def _stream(
    state: AppState, request_id: str, fmt: Formatter, usage: ChunkUsage, drain: Drain
) -> AsyncIterator[str]:
    ended = False  # reached an end the worker knows about: nothing to cancel
    # Counted from the first chunk: a body never iterated must not hold a drain open.
    drain.opened()
    try:
        if fmt.first_chunk is not None:
            yield sse(fmt.first_chunk | usage.field())
        async for event in relay_events(state.redis, state.settings, request_id):
            text = event.get("text", "")
            usage.update(event)
            if event["type"] == "delta":
                if text:
                    yield sse(fmt.chunk(text, None) | usage.field())
                continue
            if event["type"] == "error":
                ended = event.get("code") != "no_workers"  # still queued: cancel it below
                if text:
                    yield sse(fmt.chunk(text, None))
                yield sse(event_error(event).body())
                break
            ended = True
            # finish_reason rides on the last content chunk
            last = fmt.chunk(text, event["finish_reason"])
            yield sse(last | usage.field())
            if usage.include_usage:
                yield sse(fmt.usage_chunk(usage.final()))
        yield sse("[DONE]")
    finally:
        drain.closed()
        if not ended:  # the client went away (the response task was cancelled)
            with anyio.CancelScope(shield=True):
                await publish_cancel(state.redis, state, request_id)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(
    request: Request, state: AppState, request_id: str, fmt: Formatter, headers: dict[str, str]
) -> Response:
    async def consume() -> tuple[str, dict[str, Any]]:
        parts: list[str] = []
        async for event in relay_events(state.redis, state.settings, request_id):
            parts.append(event.get("text", ""))
            if event.get("code") == "no_workers":  # still queued: whoever picks it up drops it
                await publish_cancel(state.redis, state, request_id)
            if event["type"] in FINAL_EVENTS:
                return "".join(parts), event
        raise AssertionError("relay ended without a final event")

    collector = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not collector.done():
            collector.cancel()
            with anyio.CancelScope(shield=True):
                await publish_cancel(state.redis, state, request_id)
    if not collector.done() or collector.cancelled():
        return Response(status_code=499)  # nobody is listening any more
    text, event = collector.result()
    if event["type"] == "error":
        err = event_error(event)
        return JSONResponse(err.body(), status_code=err.status, headers=headers)
    usage = Usage.from_counts(event["usage"])
    return JSONResponse(fmt.response(text, event["finish_reason"], usage), headers=headers)
