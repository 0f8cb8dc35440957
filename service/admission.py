# Admission's last step: the enqueue, atomic against the queue limit (the API's XADD, and the
# batch runner's once-per-request-id variant), and the cancel a client that went away publishes.
from __future__ import annotations

from redis.asyncio import Redis

from service import streams as p
from service.context import AdmissionContext
from service.errors import APIError

# Atomic admission against the queue limit: XADD only while XLEN is under ARGV[1].
ENQUEUE_SCRIPT = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[1], '*', 'r', ARGV[2])
"""


async def enqueue(redis: Redis, state: AdmissionContext, queued: p.QueuedRequest) -> None:
    settings = state.settings
    added = await redis.eval(
        p.ENQUEUE_SCRIPT,
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


async def publish_cancel(redis: Redis, state: AdmissionContext, request_id: str) -> None:
    await redis.set(p.cancel_key(request_id), "1", ex=state.settings.output_ttl_s)
