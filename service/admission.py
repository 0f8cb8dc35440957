# Admission's last step: the enqueue, atomic against the queue limit (the API's, routed to a
# worker by service/routing.py, and the batch runner's once-per-request-id variant on the shared
# batch queue), and the cancel a client that went away publishes.
from __future__ import annotations

import math
from collections.abc import Sequence

from redis.asyncio import Redis

from service import streams as p
from service.context import AdmissionContext
from service.errors import APIError
from service.queued_request import QueuedRequest
from service.routing import Routed, route_call, routed

# KEYS: the queue, its queued-tokens counter, the request's marker. ARGV: queue limit, encoded
# request, its queued tokens, marker TTL. Returns the entry id (the existing one when already
# enqueued), or false when the queue is full.
ENQUEUE_ONCE_SCRIPT = """
local done = redis.call('GET', KEYS[3])
if done then return done end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
redis.call('INCRBY', KEYS[2], tonumber(ARGV[3]))
local id = redis.call('XADD', KEYS[1], '*', 'r', ARGV[2])
redis.call('SET', KEYS[3], id, 'EX', tonumber(ARGV[4]))
return id
"""


# A request's expected output before any worker has measured the mean (workers/gpu/load_report.py).
DEFAULT_OUTPUT_TOKENS = 256.0
DEFAULT_PROMPT_TOKENS = 256.0  # ... and its prompt, for the work and KV of the mean request


def queued_tokens(queued: QueuedRequest, mean_output: float | None) -> int:
    """The work a request adds to its queue, in tokens: its prompt and its expected output (the
    fleet's mean output, or max_tokens when that is smaller)."""
    expected = DEFAULT_OUTPUT_TOKENS if mean_output is None else mean_output
    num_prompt = len(queued.prompt_token_ids)
    return num_prompt + min(queued.sampling.max_tokens, math.ceil(expected)) * queued.sampling.n


def enqueued_key(request_id: str) -> str:
    return f"fleetlm:batch:enqueued:{request_id}"


async def enqueue(
    redis: Redis, state: AdmissionContext, queued: QueuedRequest, routes: Sequence[str] = ()
) -> Routed:
    """Onto the queue of the worker routing picks among `routes` (the worker ids with queues),
    or the shared one; 503 when the priority already holds max_queue_len entries."""
    settings = state.settings
    call = route_call(queued, settings, routes, limit=settings.max_queue_len)
    added = await redis.eval(*call)
    if added is None:
        raise APIError(
            503,
            f"The {queued.priority} queue is full ({settings.max_queue_len} requests); "
            "retry shortly.",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": str(settings.queue_retry_after_s)},
        )
    return routed(added, routes, queued.priority)


async def enqueue_once(state: AdmissionContext, queued: QueuedRequest) -> str | None:
    """Idempotent per request id (a batch pump that crashed after enqueueing but before its
    commit re-admits nothing): the entry id, the first one's if already enqueued, or None when
    the queue is full."""
    entry_id = await state.redis.eval(
        ENQUEUE_ONCE_SCRIPT,
        3,
        p.queue_key(queued.priority),
        p.queued_tokens_key(queued.priority),
        enqueued_key(queued.request_id),
        state.settings.max_queue_len,
        queued.encode(),
        queued.queued_tokens,
        state.settings.batch_output_ttl_s,
    )
    if entry_id is None or isinstance(entry_id, str):
        return entry_id
    return entry_id.decode()


async def publish_cancel(
    redis: Redis, state: AdmissionContext, request_id: str, delivered: int | None = None
) -> None:
    """`delivered`: output tokens the client received, which is what the request is billed
    (the worker may have produced a few more before it sees the cancel)."""
    value, ttl = p.cancel_value(delivered), state.settings.output_ttl_s
    await redis.set(p.cancel_key(request_id), value, ex=ttl)
