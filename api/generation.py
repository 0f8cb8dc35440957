# The shared flow of a generation endpoint: shed, admit, enqueue, then relay the output stream as
# SSE or collect it into one response. A client that goes away (stream or not) publishes a cancel
# saying how many output tokens it received, which is what the request is billed.
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from api.client_leases import Lease
from api.drain import Drain
from api.metrics import ADMISSIONS, REJECTIONS, ROUTED
from api.relay import relay_events
from api.sse import ChunkTemplate, EventStreamResponse, Peer, attach_peer, sse
from api.state import AppState
from metering.keys import Principal
from service.admission import enqueue, publish_cancel
from service.errors import APIError, event_error, redis_unavailable
from service.events import FINAL_EVENTS
from service.limit_reservations import drop_slot
from service.limits import release, reserve
from service.logging_setup import request_id_var
from service.queued_request import QueuedRequest
from service.redis_clients import UNREACHABLE, Backoff
from service.schemas.choices import Choices
from service.schemas.formatter import Formatter
from service.schemas.usage import ChunkUsage, Usage

log = logging.getLogger("fleetlm.api")

_background: set[asyncio.Task] = set()  # tasks that outlive their request (held, not collected)


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
    # Drain, load (503 with Retry-After), limits (429 with x-ratelimit-* headers), then the
    # queue; all before any byte.
    lease: Lease | None = None
    try:
        try:
            drain.check()
            # Bounded as a whole: the API's Redis client waits longer than the timeout for a
            # reply (its relay reads block), and a paused Redis must still get a prompt 503.
            async with asyncio.timeout(state.settings.redis_timeout_s):
                started = time.time()
                prediction = await state.shedder.admit(state.redis, queued)
                shed = time.time()
                headers = await reserve(state, principal, queued)
                try:
                    lease = await state.leases.open(queued.request_id)
                    queued.leased = True
                    reserved = time.time()
                    target = await enqueue(state.redis, state, queued, state.shedder.routes)
                except APIError:
                    await release(state, queued)
                    raise
        except (*UNREACHABLE, TimeoutError) as exc:
            # It may have been reserved, or even enqueued, before Redis stopped answering:
            # once it is back, a cancel drops the entry and the slot is released.
            _in_background(_forget(state, queued))
            raise redis_unavailable(state.settings.unavailable_retry_after_s) from exc
    except APIError as exc:
        if lease is not None:
            state.leases.close(lease)
        reason = exc.type if exc.status == 429 else (exc.code or exc.type)
        REJECTIONS.labels(tenant, queued.priority, str(exc.status), reason).inc()
        raise
    ADMISSIONS.labels(tenant, queued.priority).inc()
    ROUTED.labels(queued.priority, "shared" if target.worker_id is None else "worker").inc()
    log.info(
        "request admitted",
        extra={
            "tenant": tenant,
            "priority": queued.priority,
            "prompt_tokens": len(queued.prompt_token_ids),
            "worker": target.worker_id,
            "matched_blocks": target.matched_blocks,
            # Where its time before the queue went (ms): since tokenization (the request's
            # enqueue stamp, from which its queue time counts), then the stages: admission's
            # load read and forecast, the limits and lease, the enqueue. A total well over their
            # sum is time the process's event loop spent elsewhere.
            "admit_ms": round((time.time() - queued.enqueued_at) * 1000, 1),
            "shed_ms": round((shed - started) * 1000, 1),
            "reserve_ms": round((reserved - shed) * 1000, 1),
            "enqueue_ms": round((time.time() - reserved) * 1000, 1),
        },
    )
    headers["x-request-id"] = queued.request_id
    # What admission forecast for its first token (api/load_shedding.py), against which a client
    # or a benchmark can hold what it measured.
    headers["x-fleetlm-predicted-ttft"] = f"{prediction.ttft_s:.3f}"
    choices = Choices(fmt, queued.sampling.n)
    if stream:
        usage = ChunkUsage(include_usage, continuous_usage, len(queued.prompt_token_ids))
        peer = attach_peer(request.scope)
        body = _stream(peer, state, lease, choices, usage, drain)
        headers["cache-control"] = "no-cache"
        return EventStreamResponse(body, peer, headers, on_close=lambda: state.leases.close(lease))
    drain.opened()
    try:
        return await _collect(request, state, queued.request_id, choices, headers, drain)
    finally:
        drain.closed()
        state.leases.close(lease)


async def _stream(
    peer: Peer,
    state: AppState,
    lease: Lease,
    choices: Choices,
    usage: ChunkUsage,
    drain: Drain,
) -> AsyncIterator[str]:
    request_id = lease.request_id
    ended = False  # reached an end the worker wrote: nothing to cancel
    delivered = 0  # output tokens whose text was handed to the client
    # Counted from the first chunk: a body never iterated must not hold a drain open.
    drain.opened()

    fmt = choices.formatters[0]

    def content(text: str) -> dict[str, Any]:
        return fmt.chunk(text, None) | usage.field()

    # Only the text is encoded per token (api/sse.py), unless every chunk has its own usage
    # or the chunks are of several choices.
    template = None if usage.continuous or choices.n > 1 else ChunkTemplate(content)
    try:
        for first in choices.first_chunks():
            yield sse(first | usage.field())
        events = relay_events(
            state.redis, state.settings, request_id, drain.deadline_passed, state.mux
        )
        async for event in events:
            kind = event["type"]
            if kind == "keepalive":
                yield ": keepalive\n\n"
                continue
            text = event.get("text", "")
            usage.update(event)
            if kind == "delta" and "finish_reason" in event:  # one of n choices ended
                for last in choices.closing_chunks(event):
                    yield sse(last | usage.field())
                delivered = lease.delivered = event["completion_tokens"]
                continue
            if kind == "delta":
                _, fmt = choices.of(event)
                text = fmt.feed(text)
                logprobs = fmt.event_logprobs(event)
                if text or logprobs:
                    if logprobs:  # rare: the plain encoder, with the tokens' logprobs
                        yield sse(fmt.chunk(text, None, logprobs) | usage.field())
                    else:
                        yield template.event(text) if template else sse(content(text))
                    # Sent, unless the connection closed meanwhile (then the send did nothing).
                    # One turn of the event loop lets a hang-up on the wire reach `peer`.
                    await asyncio.sleep(0)
                    if peer.gone:
                        break
                delivered = lease.delivered = event["completion_tokens"]
                continue
            if kind == "error":
                ended = event.get("worker") is not None  # else the relay gave up: tell the worker
                if text:
                    yield sse(content(text))
                if usage.include_usage or usage.continuous:
                    # What is billed: the worker's usage on its error, else (the relay gave
                    # up) the tokens delivered, which the cancel below tells the worker.
                    yield sse(fmt.usage_chunk(usage.final()))
                yield sse(event_error(event).body())
                break
            ended = True
            # finish_reason rides on the last chunk (after any tool calls held back)
            for last in choices.closing_chunks(event):
                yield sse(last | usage.field())
            if usage.include_usage:
                yield sse(fmt.usage_chunk(usage.final()))
        yield sse("[DONE]")
    finally:
        drain.closed()
        if not ended:  # the client went away (the task was cancelled) or the relay gave up
            with anyio.CancelScope(shield=True):
                await _cancel(state, request_id, delivered)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(
    request: Request,
    state: AppState,
    request_id: str,
    choices: Choices,
    headers: dict[str, str],
    drain: Drain,
) -> Response:
    async def consume() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async for event in relay_events(
            state.redis, state.settings, request_id, drain.deadline_passed, state.mux
        ):
            if event["type"] == "keepalive":
                continue
            events.append(event)
            if event["type"] == "error" and event.get("worker") is None:
                await _cancel(state, request_id, 0)  # the relay gave up: the worker must too
            if event["type"] in FINAL_EVENTS:
                return events
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
                await _cancel(state, request_id, 0)  # nothing of it reached the client
    if not collector.done() or collector.cancelled():
        return Response(status_code=499)  # nobody is listening any more
    events = collector.result()
    event = events[-1]
    if event["type"] == "error":
        err = event_error(event)
        if err.status == 503:
            headers = headers | {"retry-after": str(state.settings.unavailable_retry_after_s)}
        return JSONResponse(err.body(), status_code=err.status, headers=headers)
    body = choices.response(events, Usage.of_event(event))
    return JSONResponse(body, headers=headers)


# -- when Redis does not answer ---------------------------------------------------------------


def _in_background(coro) -> None:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _cancel(state: AppState, request_id: str, delivered: int) -> None:
    """Publish the cancel now, or keep trying in the background while Redis is away."""
    try:
        await publish_cancel(state.redis, state, request_id, delivered)
    except UNREACHABLE:
        cancel = lambda: publish_cancel(state.redis, state, request_id, delivered)  # noqa: E731
        _in_background(_until_redis_returns(state, cancel, request_id))


async def _forget(state: AppState, queued: QueuedRequest) -> None:
    """A request whose admission Redis stopped answering half way: drop whatever it left."""
    rid = queued.request_id
    await _until_redis_returns(state, lambda: publish_cancel(state.redis, state, rid, 0), rid)
    if queued.reservation is not None:
        await _until_redis_returns(state, lambda: release(state, queued), rid)
    else:  # the reservation may have run without its reply reaching us: free the slot
        slot = lambda: drop_slot(state.redis, queued.tenant_id, queued.priority, rid)  # noqa: E731
        await _until_redis_returns(state, slot, rid)


async def _until_redis_returns(state: AppState, call, request_id: str) -> None:
    backoff = Backoff(cap_s=1.0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2 * state.settings.redis_outage_s
    while True:
        try:
            await call()
            return
        except UNREACHABLE:
            if loop.time() > deadline:
                log.warning("Redis stayed away: gave up cleaning up after %s", request_id)
                return
            await asyncio.sleep(backoff.next_s())
