# Every service process reaches Redis through these: bounded timeouts (a paused Redis answers
# nothing, and a client without a timeout would wait forever) and a short retry of connection
# errors only (a restarting Redis refuses connections; the command never ran). A timed-out
# command may have run, so it is not retried here: each caller decides (the worker re-sends its
# round trip, whose effects are idempotent; the relay reads again; admission answers 503).
from __future__ import annotations

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from service.settings import Settings

CONNECT_RETRIES = 2
# Redis did not answer (down, restarting, paused); any other RedisError is a reply (a bug).
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


def _options(settings: Settings, block_s: float) -> dict:
    return {
        "decode_responses": True,
        # A blocking read (XREAD/XREADGROUP BLOCK) legitimately waits its block time first.
        "socket_timeout": settings.redis_timeout_s + block_s,
        "socket_connect_timeout": settings.redis_timeout_s,
        "socket_keepalive": True,
    }


def sync_redis(url: str, settings: Settings, *, block_s: float = 0.0, **kwargs) -> redis.Redis:
    """`block_s`: the longest BLOCK its blocking reads use."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), CONNECT_RETRIES, (redis.ConnectionError,))
    return redis.Redis.from_url(url, retry=retry, **_options(settings, block_s) | kwargs)


def async_redis(
    url: str, settings: Settings, *, block_s: float = 0.0, **kwargs
) -> redis.asyncio.Redis:
    retry = AsyncRetry(
        ExponentialBackoff(cap=0.5, base=0.05), CONNECT_RETRIES, (redis.ConnectionError,)
    )
    return redis.asyncio.Redis.from_url(url, retry=retry, **_options(settings, block_s) | kwargs)


class Backoff:
    """Waits between attempts while a service is away: doubling from `base_s` up to `cap_s`."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 1.0) -> None:
        self.base_s, self.cap_s = base_s, cap_s
        self.attempts = 0

    def next_s(self) -> float:
        delay = min(self.cap_s, self.base_s * 2**self.attempts)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
