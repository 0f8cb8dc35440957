# This API process's copy of the revoked keys' hashes (service/revocations.py): loaded from the
# Redis set and kept current from the channel, by one background task. Subscribed first, then
# the set read, so a key revoked in between is in one or the other; after a lost connection
# (Redis restarted) both again. While Redis is paused nothing new arrives, and what was revoked
# meanwhile comes in when it answers again.
from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from service.redis_clients import UNREACHABLE, Backoff
from service.revocations import REVOKED_CHANNEL, REVOKED_KEYS_SET

log = logging.getLogger("fleetlm.api")


class RevokedKeys:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.hashes: set[str] = set()
        self._task: asyncio.Task | None = None

    def __contains__(self, digest: str) -> bool:
        return digest in self.hashes

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="revoked-keys")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # bounded: a pub/sub or pipeline cleanup that waits on a Redis that no longer
            # answers must not hold the process's shutdown
            await asyncio.wait({self._task}, timeout=2.0)

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(REVOKED_CHANNEL)
                    self.hashes |= set(await self.redis.smembers(REVOKED_KEYS_SET))
                    backoff.reset()
                    while True:
                        message = await pubsub.get_message(timeout=1.0)
                        if message is not None and message["type"] == "message":
                            self.hashes.add(message["data"])
            except UNREACHABLE:
                await asyncio.sleep(backoff.next_s())
            except Exception:
                log.exception("reading the revoked keys failed; retrying")
                await asyncio.sleep(backoff.next_s())
