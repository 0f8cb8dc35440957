# Admission's last step: the enqueue, atomic against the queue limit (the API's XADD, and the
# batch runner's once-per-request-id variant), and the cancel a client that went away publishes.
from __future__ import annotations

from redis.asyncio import Redis

from service import streams as p
from service.context import AdmissionContext
from service.errors import APIError
from service.queued_request import QueuedRequest

# KEYS: the queue. ARGV: queue limit, encoded request. XADD only while XLEN is under the limit.
ENQUEUE_SCRIPT = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[1], '*', 'r', ARGV[2])
"""

# KEYS: the queue, the request's marker. ARGV: queue limit, encoded request, marker TTL.
# Returns the entry id (the existing one when already enqueued), or false when the queue is full.
ENQUEUE_ONCE_SCRIPT = """
local done = redis.call('GET', KEYS[2])
if done then return done end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
local id = redis.call('XADD', KEYS[1], '*', 'r', ARGV[2])
redis.call('SET', KEYS[2], id, 'EX', tonumber(ARGV[3]))
return id
"""


def enqueued_key(request_id: str) -> str:
    return f"fleetlm:batch:enqueued:{request_id}"


async def enqueue(redis: Redis, state: AdmissionContext, queued: QueuedRequest) -> None:
    settings = state.settings
    added = await redis.eval(
        ENQUEUE_SCRIPT,
        1,
        p.queue_key(queued.priority),
        settings.max_queue_len,
        queued.encode(),
    )
    if added is None:
        raise APIError(
            503,
            f"The {queued.priority} queue is full ({settings.max_queue_len} requests); "
            "retry shortly.",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": str(settings.queue_retry_after_s)},
        )


async def enqueue_once(state: AdmissionContext, queued: QueuedRequest) -> str | None:
    """Idempotent per request id (a batch pump that crashed after enqueueing but before its
    commit re-admits nothing): the entry id, the first one's if already enqueued, or None when
    the queue is full."""
    entry_id = await state.redis.eval(
        ENQUEUE_ONCE_SCRIPT,
        2,
        p.queue_key(queued.priority),
        enqueued_key(queued.request_id),
        state.settings.max_queue_len,
        queued.encode(),
        state.settings.batch_output_ttl_s,
    )
    if entry_id is None or isinstance(entry_id, str):
        return entry_id
    return entry_id.decode()


async def publish_cancel(redis: Redis, state: AdmissionContext, request_id: str) -> None:
    await redis.set(p.cancel_key(request_id), "1", ex=state.settings.output_ttl_s)
