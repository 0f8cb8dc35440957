# Sends one control command (service/control.py) to every live worker and gathers the replies,
# waiting at most control_timeout_s. A worker whose heartbeat is gone is skipped, before sending
# and after waiting (one that died meanwhile owes no reply); a live worker that did not answer in
# time makes the call fail with a 503 (retryable: aiperf retries a reset that gets one).
from __future__ import annotations

import time
import uuid

from redis.asyncio import Redis

from api.relay import live_workers
from service import streams as p
from service.control import Command, ControlCommand, ControlReply
from service.errors import APIError


async def broadcast(redis: Redis, command: Command, timeout_s: float) -> list[ControlReply]:
    workers = await live_workers(redis)
    if not workers:
        raise APIError(503, "no live worker", type="server_error", code="no_workers")
    reply_to = p.control_reply_key(uuid.uuid4().hex)
    message = ControlCommand(command, reply_to, deadline=time.time() + timeout_s).encode()
    ttl = int(timeout_s) + 1
    pipe = redis.pipeline(transaction=False)
    for worker in workers:
        pipe.rpush(p.control_key(worker), message)
        pipe.expire(p.control_key(worker), ttl)
    await pipe.execute()

    replies: dict[str, ControlReply] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(replies) < len(workers):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # In slices: the client's socket timeout (redis-py's default 5 s) bounds one read.
            item = await redis.blpop([reply_to], timeout=min(max(left, 0.01), 1.0))
            if item is None:
                continue
            reply = ControlReply.decode(item[1])
            replies[reply.worker] = reply
    finally:
        await redis.delete(reply_to)

    silent = set(workers) - set(replies)
    if silent and (silent := silent & set(await live_workers(redis))):
        raise APIError(
            503,
            f"worker(s) {', '.join(sorted(silent))} did not answer {command} within "
            f"{timeout_s:g}s; try again",
            type="server_error",
            code="worker_timeout",
            headers={"Retry-After": "1"},
        )
    failed = [r for r in replies.values() if not r.ok]
    if failed:
        detail = "; ".join(f"{r.worker}: {r.error}" for r in failed)
        raise APIError(500, f"{command} failed on {detail}", type="server_error", code="failed")
    return [replies[w] for w in workers if w in replies]
