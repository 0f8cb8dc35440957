# One blocking XREAD per API process for the output streams of every request it relays.
#
# Each relay used to block on its own stream (one Redis command, and one pooled connection,
# per stream per token): at ~130 streams and 4,000 tokens/s on the H200 the API process spent
# most of a core on those round trips, and a busy event loop delays every request it serves
# (TTFT and TPOT both). The mux reads all subscribed streams with one XREAD and hands each
# stream's entries to its relay; a worker step's tokens for all its requests arrive in one or a
# few reads.
#
# A new subscription joins the next read: `block_ms` bounds how long that can take while other
# streams are quiet (under load the read returns at every worker step anyway). While no stream
# is subscribed the reader sleeps. A Redis error reaches every subscriber's pending read (each
# relay has its own outage handling, api/relay.py); the reader retries after `retry_s`.
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from redis.asyncio import Redis

from service.redis_clients import UNREACHABLE

log = logging.getLogger("fleetlm.api")


class Subscription:
    __slots__ = ("entries", "error", "key", "last_id", "waiter")

    def __init__(self, key: str, last_id: str) -> None:
        self.key = key
        self.last_id = last_id  # the last entry handed over (the reader continues after it)
        self.entries: deque = deque()  # (entry_id, fields), read but not yet taken
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None

    @property
    def ready(self) -> bool:
        """A read would return entries at once."""
        return bool(self.entries) and self.error is None

    async def read(self, timeout_s: float, count: int = 512) -> list[tuple[str, list]]:
        """Like XREAD on this one stream: [(key, [(entry_id, fields), ...])], or [] when
        nothing came within timeout_s. Raises the reader's Redis error, once."""
        if not self.entries and self.error is None:
            loop = asyncio.get_running_loop()
            self.waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self.waiter = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if not self.entries:
            return []
        n = min(count, len(self.entries))
        return [(self.key, [self.entries.popleft() for _ in range(n)])]

    def _deliver(self, entries: list) -> None:
        self.entries.extend(entries)
        self.last_id = entries[-1][0]
        _wake(self.waiter)

    def _fail(self, error: BaseException) -> None:
        self.error = error
        _wake(self.waiter)


def _wake(waiter: asyncio.Future | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class StreamMux:
    def __init__(
        self, redis: Redis, *, block_ms: int = 5, count: int = 512, retry_s: float = 0.1
    ) -> None:
        self.redis = redis
        self.block_ms = block_ms
        self.count = count
        self.retry_s = retry_s
        self._subs: dict[str, Subscription] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self.num_reads = 0  # XREAD calls made (tests and curiosity)

    def subscribe(self, key: str, last_id: str = "0-0") -> Subscription:
        if key in self._subs:
            raise ValueError(f"stream {key!r} already has a reader in this process")
        sub = self._subs[key] = Subscription(key, last_id)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stream-mux")
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if self._subs.get(sub.key) is sub:
            del self._subs[sub.key]

    async def aclose(self) -> None:
        # (A cancelled read can surface from redis-py as a connection error, which the loop
        # would ride out: the flag ends the loop whatever the cancel turns into.)
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while not self._closed:
            if not self._subs:
                self._wake.clear()
                await self._wake.wait()
                continue
            streams = {key: sub.last_id for key, sub in self._subs.items()}
            try:
                self.num_reads += 1
                response = await self.redis.xread(streams, count=self.count, block=self.block_ms)
            except UNREACHABLE as exc:
                if self._closed:
                    return
                self._fail_all(exc)
                await asyncio.sleep(self.retry_s)
                continue
            except Exception as exc:  # a reply Redis refused: tell the relays, keep reading
                if self._closed:
                    return
                log.exception("output stream read failed")
                self._fail_all(exc)
                await asyncio.sleep(self.retry_s)
                continue
            for key, entries in response or ():
                sub = self._subs.get(key)
                # (a stream re-subscribed meanwhile starts from its own last id, not this read)
                if sub is not None and entries and sub.last_id == streams[key]:
                    sub._deliver(entries)

    def _fail_all(self, error: BaseException) -> None:
        for sub in self._subs.values():
            sub._fail(error)
