# Leases on the requests this API process relays: while a client is connected through this
# process, its request's lease key (service/streams.py's lease_key) is rewritten every
# api_lease_refresh_s with the output tokens the client has been sent, and expires
# api_lease_ttl_s after the last write. A process that dies (kill -9, OOM) stops writing: the
# request's worker sees the lease gone and stops the request, billed the tokens the lease last
# recorded — the rule of a client that went away (workers/gpu/client_leases.py). One pipelined
# write per interval for all the process's leases, never a command per token.
from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from service import streams as p
from service.redis_clients import UNREACHABLE
from service.settings import Settings

log = logging.getLogger("fleetlm.api")


class Lease:
    __slots__ = ("delivered", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.delivered = 0  # output tokens whose text this process handed to the client


class ClientLeases:
    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.refresh_s = settings.api_lease_refresh_s
        self.ttl_ms = max(1, int(settings.api_lease_ttl_s * 1000))
        self._leases: dict[str, Lease] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def open(self, request_id: str) -> Lease:
        """Written once before the request is enqueued, so its worker always finds it."""
        lease = Lease(request_id)
        await self.redis.set(p.lease_key(request_id), p.cancel_value(0), px=self.ttl_ms)
        self._leases[request_id] = lease
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="leases")
        return lease

    def close(self, lease: Lease) -> None:
        """The request ended (or its end was published as a cancel): the lease lapses."""
        if self._leases.get(lease.request_id) is lease:
            del self._leases[lease.request_id]

    def __len__(self) -> int:
        return len(self._leases)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # bounded: a pub/sub or pipeline cleanup that waits on a Redis that no longer
            # answers must not hold the process's shutdown
            await asyncio.wait({self._task}, timeout=2.0)

    async def _run(self) -> None:
        while True:
            if not self._leases:
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(self.refresh_s)
            pipe = self.redis.pipeline(transaction=False)
            for lease in list(self._leases.values()):
                value = p.cancel_value(lease.delivered)
                pipe.set(p.lease_key(lease.request_id), value, px=self.ttl_ms)
            try:
                await pipe.execute()
            except UNREACHABLE:
                pass  # Redis is away: the workers ride the outage out; write again next turn
            except Exception:
                log.exception("could not refresh the client leases")
