# Reads one request's output stream (fleetlm:out:{id}) as events, by the stream's rules
# (service/output_stream.py). Between events it watches liveness, so no request hangs:
# - once a worker runs the request, its heartbeat key must stay; when it goes, another worker
#   takes the request over (a `resume` event, then its deltas) or, if none does within
#   no_worker_timeout_s, the relay ends it with `worker_lost`: at most
#   worker_dead_after_s + no_worker_timeout_s + relay_poll_s after the last heartbeat;
# - before that, some worker must be alive (none for no_worker_timeout_s → `no_workers`);
# - Redis unreachable: it keeps reading with back-off and ends the request with
#   `redis_unavailable` once Redis has been away for redis_outage_s;
# - the API's drain deadline (api/drain.py) ends it with `shutdown`.
# A stream silent for sse_keepalive_s yields a keep-alive, so the client always hears something,
# also while a Redis command hangs on a paused Redis (the relay never waits past a keep-alive).
# Reads go through the process's StreamMux (api/stream_mux.py: one XREAD for every relayed
# stream) when one is given, else straight to Redis.
# Events the relay makes itself carry no "worker": the worker still has to learn the request
# ended (the caller publishes a cancel).
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from service import streams as p
from service.events import FINAL_EVENTS, ErrorEvent, Event, decode_event, error_event
from service.output_stream import OutputFollower
from service.redis_clients import UNREACHABLE, Backoff
from service.settings import Settings

if TYPE_CHECKING:
    from api.stream_mux import StreamMux, Subscription

KEEPALIVE: dict = {"type": "keepalive"}


async def live_workers(redis: Redis) -> list[str]:
    members = sorted(await redis.smembers(p.WORKERS_SET))
    if not members:
        return []
    alive = await redis.mget([p.alive_key(w) for w in members])
    dead = [w for w, a in zip(members, alive) if a is None]
    if dead:
        await redis.srem(p.WORKERS_SET, *dead)
    return [w for w, a in zip(members, alive) if a is not None]


class Liveness:
    """Whether someone is (or will be) running the request: the deadline logic of one relay."""

    def __init__(self, settings: Settings) -> None:
        self.timeout_s = settings.no_worker_timeout_s
        self.since: float | None = None  # nobody seen running it (or able to) since then

    def ok(self) -> None:
        self.since = None

    def missing(self, now: float) -> bool:
        """True once nobody has been there for the timeout."""
        if self.since is None:
            self.since = now
        return now - self.since > self.timeout_s


async def relay_events(
    redis: Redis,
    settings: Settings,
    request_id: str,
    deadline_passed: Callable[[], bool] = lambda: False,
    mux: StreamMux | None = None,
) -> AsyncIterator[dict]:
    key = p.output_key(request_id)
    subscription = mux.subscribe(key) if mux is not None else None
    try:
        async with contextlib.aclosing(
            _relay(redis, settings, key, subscription, deadline_passed)
        ) as events:
            async for event in events:
                yield event
    finally:
        if subscription is not None:
            mux.unsubscribe(subscription)


async def _relay(
    redis: Redis,
    settings: Settings,
    key: str,
    subscription: Subscription | None,
    deadline_passed: Callable[[], bool],
) -> AsyncIterator[dict]:
    last_id = "0-0"
    follower = OutputFollower()
    liveness = Liveness(settings)
    outage_since: float | None = None
    backoff = Backoff(cap_s=settings.relay_poll_s)
    block_s = max(0.001, settings.relay_poll_s)
    last_yield = time.monotonic()
    # The read (or liveness check) in flight. The relay never waits on it past the next
    # keep-alive: a paused Redis holds a command for the whole socket timeout
    # (FLEETLM_REDIS_TIMEOUT_S), and the client must still hear something every
    # sse_keepalive_s; the same command is waited on again after the keep-alive.
    pending: asyncio.Task | None = None
    try:
        while True:
            if deadline_passed():
                yield error_event(
                    "The server is shutting down; the request was stopped.", "shutdown"
                )
                return
            try:
                if pending is None and subscription is not None and subscription.ready:
                    # The hot path under load: entries the mux already read, no task needed.
                    response, gone = await subscription.read(0, count=512), None
                else:
                    if pending is None:
                        pending = asyncio.ensure_future(
                            _poll(redis, key, last_id, subscription, block_s, follower, liveness)
                        )
                    wait_s = max(0.0, last_yield + settings.sse_keepalive_s - time.monotonic())
                    done, _ = await asyncio.wait({pending}, timeout=wait_s)
                    if not done:
                        last_yield = time.monotonic()
                        yield KEEPALIVE
                        continue
                    task, pending = pending, None
                    response, gone = task.result()
            except UNREACHABLE:
                now = time.monotonic()
                if outage_since is None:
                    outage_since = now
                elif now - outage_since > settings.redis_outage_s:
                    yield _outage_error(settings)
                    return
                await asyncio.sleep(backoff.next_s())  # at most relay_poll_s
                continue
            if outage_since is not None:
                # Every heartbeat lapsed meanwhile: judge liveness afresh from here.
                outage_since = None
                backoff.reset()
                liveness.ok()
            if not response:
                if gone is not None:
                    yield gone
                    return
                continue
            for _, entries in response:
                for entry_id, fields in entries:
                    last_id = entry_id
                    event: Event = decode_event(fields)
                    if not follower.accept(event):
                        continue
                    liveness.ok()
                    last_yield = time.monotonic()
                    yield event
                    if event["type"] in FINAL_EVENTS:
                        return
    finally:
        if pending is not None and not pending.done():
            pending.cancel()  # (redis-py drops the connection of a command cancelled mid-way)


async def _poll(
    redis: Redis,
    key: str,
    last_id: str,
    subscription: Subscription | None,
    block_s: float,
    follower: OutputFollower,
    liveness: Liveness,
) -> tuple[list, ErrorEvent | None]:
    """One read of the stream after `last_id`; after a quiet one, whether anybody still runs
    the request (the error to end with, else None)."""
    if subscription is not None:
        response = await subscription.read(block_s, count=512)
    else:
        response = await redis.xread({key: last_id}, count=512, block=int(block_s * 1000))
    if response:
        return response, None
    return response, await _nobody_running(redis, follower, liveness)


async def _nobody_running(
    redis: Redis, follower: OutputFollower, liveness: Liveness
) -> ErrorEvent | None:
    """After a quiet poll: the error to end with if nobody has been running the request for the
    timeout, else None."""
    now = time.monotonic()
    if follower.owner is not None:
        # Started on a worker: it must stay alive, or another one must take the request over.
        if await redis.exists(p.alive_key(follower.owner)):
            liveness.ok()
            return None
        if liveness.missing(now):
            return error_event(
                f"worker {follower.owner} stopped while running this request and no other "
                "worker took it over",
                "worker_lost",
            )
        return None
    # Still queued: it only needs some live worker to eventually pick it up.
    if await live_workers(redis):
        liveness.ok()
    elif liveness.missing(now):
        return error_event("no live worker to run it", "no_workers")
    return None


def _outage_error(settings: Settings) -> ErrorEvent:
    return error_event(
        f"Redis was unreachable for more than {settings.redis_outage_s:.0f}s",
        "redis_unavailable",
    )
