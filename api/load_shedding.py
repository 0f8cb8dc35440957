# Overload: shed at admission instead of queueing work that cannot start in time. A request's
# predicted wait is the work queued ahead of it, in tokens (fleetlm:q:{priority}:tokens: prompt
# plus expected output of every request not yet read by a worker), divided by the fleet's service
# rate (the sum of the live workers' tokens per second of work, workers/load_report.py). Batch
# (flex) work waits behind interactive work as well as its own, so under load it is shed first.
# Over max_queue_wait_s (batch_max_queue_wait_s for flex) → 503 `overloaded` with a Retry-After
# of the time the queue needs to drain back to the bound if nothing else arrived.
#
# Each API process reads the load at most every load_refresh_s (one Lua call and one pipeline),
# so admission itself stays one Redis round trip. With no rate measured yet (a fleet that has not
# worked) nothing is shed: the queue-length bound (max_queue_len) still holds.
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from api.relay import live_workers
from service import streams as p
from service.admission import queued_tokens
from service.errors import APIError
from service.queued_request import QueuedRequest
from service.settings import Settings

# KEYS: per priority, its token counter then its queues (shared and routed). ARGV: the group,
# then per priority how many queues it has. Returns each counter; one whose queues have nothing
# undelivered (every entry pending on a worker) is reset to 0 first, which heals the drift a
# worker that died between reading entries and reporting them leaves behind.
LOAD_SCRIPT = """
local out = {}
local k = 1
for i = 2, #ARGV do
  local counter, num_queues = KEYS[k], tonumber(ARGV[i])
  local tokens = tonumber(redis.call('GET', counter) or '0')
  if tokens ~= 0 then
    local undelivered = 0
    for q = k + 1, k + num_queues do
      local pending = redis.pcall('XPENDING', KEYS[q], ARGV[1])  -- an error until a worker exists
      if pending.err == nil then
        undelivered = undelivered + redis.call('XLEN', KEYS[q]) - pending[1]
      else
        undelivered = undelivered + redis.call('XLEN', KEYS[q])
      end
    end
    if undelivered <= 0 then
      redis.call('SET', counter, 0)
      tokens = 0
    end
  end
  table.insert(out, math.max(tokens, 0))
  k = k + 1 + num_queues
end
return out
"""


@dataclass(frozen=True, slots=True)
class Load:
    queued_tokens: dict[str, int]  # priority → tokens queued, not yet read by a worker
    tokens_per_s: float  # the live workers' service rate, summed
    mean_output_tokens: float | None  # expected output of a request (None: nothing measured)
    routes: tuple[str, ...] = ()  # workers with queues of their own (service/routing.py)

    def wait_s(self, priority: str) -> float:
        """Predicted wait before a request of `priority` is read by a worker."""
        ahead = self.queued_tokens.get("interactive", 0)
        if priority == "batch":
            ahead += self.queued_tokens.get("batch", 0)
        return ahead / self.tokens_per_s if self.tokens_per_s > 0 else 0.0


class LoadShedder:
    def __init__(self, settings: Settings, max_model_len: int) -> None:
        self.settings = settings
        self.max_model_len = max_model_len
        self._load: Load | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def load(self, redis: Redis) -> Load:
        if self._load is None or time.monotonic() - self._read_at > self.settings.load_refresh_s:
            async with self._lock:  # one reader per refresh, however many requests wait on it
                if self._load is None or (
                    time.monotonic() - self._read_at > self.settings.load_refresh_s
                ):
                    self._load = await read_load(redis)
                    self._read_at = time.monotonic()
        return self._load

    @property
    def routes(self) -> tuple[str, ...]:
        """The routed workers as of the last load read (admit() reads it first)."""
        return self._load.routes if self._load is not None else ()

    async def admit(self, redis: Redis, queued: QueuedRequest) -> None:
        """Sets the request's queued tokens; raises 503 when its predicted wait is too long."""
        load = await self.load(redis)
        queued.queued_tokens = queued_tokens(queued, self.max_model_len, load.mean_output_tokens)
        bound = (
            self.settings.batch_max_queue_wait_s
            if queued.priority == "batch"
            else self.settings.max_queue_wait_s
        )
        wait = load.wait_s(queued.priority)
        if wait <= bound:
            return
        retry_after = max(1, math.ceil(wait - bound))
        raise APIError(
            503,
            f"The server is overloaded: a {queued.priority} request would wait about "
            f"{wait:.0f}s to start (the bound is {bound:.0f}s); retry in {retry_after}s.",
            type="server_error",
            code="overloaded",
            headers={"Retry-After": str(retry_after)},
        )


async def read_load(redis: Redis) -> Load:
    routes = sorted(await redis.smembers(p.ROUTES_SET))
    keys: list[str] = []
    for prio in p.PRIORITIES:
        keys += [p.queued_tokens_key(prio), *p.queue_keys(prio, routes)]
    sizes = [len(routes) + 1] * len(p.PRIORITIES)
    tokens = await redis.eval(LOAD_SCRIPT, len(keys), *keys, p.GROUP, *sizes)
    workers = await live_workers(redis)
    rates: list[float] = []
    outputs: list[float] = []
    if workers:
        pipe = redis.pipeline(transaction=False)
        for w in workers:
            pipe.hmget(p.stats_key(w), ["tokens_per_s", "mean_output_tokens"])
        for rate, output in await pipe.execute():
            if rate is not None:
                rates.append(float(rate))
            if output is not None:
                outputs.append(float(output))
    return Load(
        queued_tokens={prio: int(t) for prio, t in zip(p.PRIORITIES, tokens)},
        tokens_per_s=sum(rates),
        mean_output_tokens=sum(outputs) / len(outputs) if outputs else None,
        routes=tuple(routes),
    )
