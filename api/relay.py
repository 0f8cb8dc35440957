# Reads one request's output stream (fleetlm:out:{id}) as events. Between events it watches
# liveness, so no request hangs: once a worker has published for the request, its heartbeat key
# must stay (gone → error after at most worker_dead_after_s + relay_poll_s from the worker's last
# heartbeat); before that, some worker must be alive (none for no_worker_timeout_s → error).
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from service import streams as p
from service.events import FINAL_EVENTS, Event, decode_event
from service.settings import Settings


async def live_workers(redis: Redis) -> list[str]:
    members = sorted(await redis.smembers(p.WORKERS_SET))
    if not members:
        return []
    alive = await redis.mget([p.alive_key(w) for w in members])
    dead = [w for w, a in zip(members, alive) if a is None]
    if dead:
        await redis.srem(p.WORKERS_SET, *dead)
    return [w for w, a in zip(members, alive) if a is not None]


async def relay_events(redis: Redis, settings: Settings, request_id: str) -> AsyncIterator[dict]:
    key = p.output_key(request_id)
    last_id = "0-0"
    worker: str | None = None
    no_worker_since: float | None = None
    block_ms = max(1, int(settings.relay_poll_s * 1000))
    while True:
        response = await redis.xread({key: last_id}, count=512, block=block_ms)
        if response:
            for _, entries in response:
                for entry_id, fields in entries:
                    last_id = entry_id
                    event: Event = decode_event(fields)
                    worker = event.get("worker") or worker
                    yield event
                    if event["type"] in FINAL_EVENTS:
                        return
            continue
        if worker is not None:
            # Started on a worker: it must stay alive until the request ends.
            if not await redis.exists(p.alive_key(worker)):
                yield {
                    "type": "error",
                    "code": "worker_lost",
                    "message": f"worker {worker} stopped while running this request",
                }
                return
            continue
        # Still queued: it only needs some live worker to eventually pick it up.
        if await live_workers(redis):
            no_worker_since = None
        elif no_worker_since is None:
            no_worker_since = time.monotonic()
        elif time.monotonic() - no_worker_since > settings.no_worker_timeout_s:
            yield {"type": "error", "code": "no_workers", "message": "no live worker to run it"}
            return
