# The Redis half of the tenant limits (metering/ratelimit.py holds what a tenant may use, from
# Postgres): concurrent sequences and tokens per minute per tenant and priority. Admission
# reserves one concurrency slot and prompt + max_tokens tokens in one Lua script, so a concurrent
# burst cannot overshoot; the end of the request releases the slot and refunds the unused tokens
# in another script that is idempotent (the slot's ZREM is the exactly-once gate), so a request
# finished twice, or released by both the API and a worker, refunds once.
#
#   fleetlm:limit:{tenant}:{priority}:running      zset request_id → lease deadline (unix s)
#   fleetlm:limit:{tenant}:{priority}:tpm:{minute} tokens reserved in that UTC minute (expires)
#
# Tokens per minute are a sliding 60-second window, estimated from two minute counters: the
# current UTC minute's tokens plus the previous minute's weighted by the share of it still
# inside the window (1 at the minute boundary, 0 a minute later). Fixed minute windows let a
# burst take twice the limit across a boundary (a full minute's worth at 12:00:59, another at
# 12:01:00); the estimate assumes the previous minute's tokens were spread evenly, which real
# traffic comes close to. Priorities have separate keys, so batch never draws on interactive
# headroom.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from metering.ratelimit import PriorityLimit

WINDOW_S = 60
UNLIMITED = -1

# KEYS: running zset, the token counters' prefix. ARGV: max_running, tpm, tokens wanted,
# request_id, lease seconds. Returns {admitted, exceeded, running, tokens used (rounded up),
# the admission minute, ms until the request would fit, ms until the window is empty again}.
RESERVE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local max_running, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, lease = tonumber(ARGV[3]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local running = redis.call('ZCARD', KEYS[1])
local window = math.floor(now / 60)
local elapsed = now - window * 60
local wkey = KEYS[2] .. ':' .. window
local current = tonumber(redis.call('GET', wkey) or '0')
local previous = tonumber(redis.call('GET', KEYS[2] .. ':' .. (window - 1)) or '0')
local weight = 1 - elapsed / 60
local used = current + previous * weight
local reset_ms = 1000
if tpm >= 0 and used + want > tpm then
  -- When would it fit? The previous minute's share decays at previous/60 tokens per second
  -- until the boundary; then the current minute becomes the previous one and decays.
  local excess = used + want - tpm
  if previous > 0 and excess <= previous * weight then
    reset_ms = excess / (previous / 60) * 1000
  elseif want <= tpm and current > 0 then
    reset_ms = ((60 - elapsed) + 60 * math.max(0, 1 - (tpm - want) / current)) * 1000
  else
    reset_ms = (60 - elapsed) * 1000
  end
end
reset_ms = math.max(1, math.ceil(reset_ms))
-- Until nothing counts any more: this minute's tokens count in full to its end, then decay
-- over the next minute; the previous minute's share is gone at this minute's end.
local function empty_ms(cur)
  if cur > 0 then return math.ceil((120 - elapsed) * 1000) end
  if previous > 0 then return math.ceil((60 - elapsed) * 1000) end
  return 0
end
used = math.ceil(used)
if max_running >= 0 and running >= max_running then
  return {0, 'requests', running, used, window, reset_ms, empty_ms(current)}
end
if tpm >= 0 and used + want > tpm then
  return {0, 'tokens', running, used, window, reset_ms, empty_ms(current)}
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[4])
redis.call('INCRBY', wkey, want)
redis.call('EXPIRE', wkey, 180)  -- read as the previous minute during the next one
return {1, '', running + 1, used + want, window, reset_ms, empty_ms(current + want)}
"""

# Frees the slot of `request_id` and refunds `refund` tokens to the admission window's counter,
# once: the slot's ZREM is the gate. Returns 1 when it released, 0 when already released. A Lua
# function, so that the worker's finish script (service/queue_ownership.py) releases in the same
# atomic call.
RELEASE_LUA = """
local function release(running, window, request_id, refund)
  if redis.call('ZREM', running, request_id) == 0 then return 0 end
  if refund > 0 and redis.call('EXISTS', window) == 1 then
    redis.call('DECRBY', window, refund)
  end
  return 1
end
"""

# KEYS: running zset, the admission window's counter. ARGV: request_id, tokens to refund.
RELEASE_SCRIPT = RELEASE_LUA + "return release(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]))\n"


def running_key(tenant_id: str, priority: str) -> str:
    return f"fleetlm:limit:{tenant_id}:{priority}:running"


def tokens_key(tenant_id: str, priority: str) -> str:
    return f"fleetlm:limit:{tenant_id}:{priority}:tpm"


def window_key(tenant_id: str, priority: str, window: int) -> str:
    return f"{tokens_key(tenant_id, priority)}:{window}"


@dataclass(frozen=True, slots=True)
class Reservation:
    """What an admission reserved; it rides on the queued request, and whoever ends the request
    (its worker, or the admission itself when the enqueue fails) releases it."""

    window: int  # the UTC minute the tokens were counted in
    tokens: int  # prompt + max_tokens


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    exceeded: str  # "" | "requests" | "tokens"
    running: int
    tokens_used: int
    window: int
    reset_ms: int  # until the request would fit (Retry-After)
    empty_ms: int  # until the token window counts nothing (x-ratelimit-reset-tokens)


def reserve_call(
    tenant_id: str,
    priority: str,
    limit: PriorityLimit,
    request_id: str,
    tokens: int,
    lease_s: float,
) -> tuple:
    """Arguments for `redis.eval(*reserve_call(...))`; its reply goes to `decision`."""
    return (
        RESERVE_SCRIPT, 2, running_key(tenant_id, priority), tokens_key(tenant_id, priority),
        UNLIMITED if limit.max_concurrency is None else limit.max_concurrency,
        UNLIMITED if limit.tokens_per_minute is None else limit.tokens_per_minute,
        tokens, request_id, lease_s,
    )  # fmt: skip


def decision(raw: list) -> Decision:
    admitted, exceeded, running, used, window, reset_ms, empty_ms = raw
    if isinstance(exceeded, bytes):
        exceeded = exceeded.decode()
    return Decision(
        bool(admitted), exceeded, int(running), int(used), int(window), int(reset_ms), int(empty_ms)
    )


def release_parts(
    tenant_id: str, priority: str, reservation: Reservation, used: int
) -> tuple[str, str, int]:
    """RELEASE_LUA's `release` arguments but the request id: the running zset, the admission
    window's counter and the tokens to refund (what was reserved and not used)."""
    return (
        running_key(tenant_id, priority),
        window_key(tenant_id, priority, reservation.window),
        max(0, reservation.tokens - used),
    )


def release_call(
    tenant_id: str, priority: str, request_id: str, reservation: Reservation, used: int
) -> tuple[str, int, str, str, str, int]:
    """Arguments for `redis.eval(*release_call(...))`; works on a pipeline too."""
    running, window, refund = release_parts(tenant_id, priority, reservation, used)
    return (RELEASE_SCRIPT, 2, running, window, request_id, refund)


def drop_slot(redis: Any, tenant_id: str, priority: str, request_id: str) -> Any:
    """Frees a slot whose reservation's reply never came back (the reservation may have run):
    no tokens to refund, since nobody knows the window. Sync or async client alike."""
    return redis.zrem(running_key(tenant_id, priority), request_id)
