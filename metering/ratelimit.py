# Per tenant and class limits in Redis: concurrent sequences and tokens per minute. Admission
# reserves one concurrency slot and prompt + max_tokens tokens in one Lua script, so a concurrent
# burst cannot overshoot; the end of the request releases the slot and refunds the unused tokens
# in another script that is idempotent (the slot's ZREM is the exactly-once gate), so a request
# finished twice, or released by both the API and a worker, refunds once.
#
#   fleetlm:limit:{tenant}:{class}:running      zset request_id → lease deadline (unix s)
#   fleetlm:limit:{tenant}:{class}:tpm:{minute} tokens reserved in that UTC minute (expires)
#
# Tokens per minute use fixed one-minute windows (the window of the admission); classes have
# separate keys, so batch never draws on interactive headroom.
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WINDOW_S = 60
UNLIMITED = -1

RESERVE_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local max_running, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, lease = tonumber(ARGV[3]), tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local running = redis.call('ZCARD', KEYS[1])
local window = math.floor(now / 60)
local wkey = KEYS[2] .. ':' .. window
local used = tonumber(redis.call('GET', wkey) or '0')
local reset_ms = math.floor(((window + 1) * 60 - now) * 1000)
if max_running >= 0 and running >= max_running then
  return {0, 'requests', running, used, window, reset_ms}
end
if tpm >= 0 and used + want > tpm then
  return {0, 'tokens', running, used, window, reset_ms}
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[4])
redis.call('INCRBY', wkey, want)
redis.call('EXPIRE', wkey, 120)
return {1, '', running + 1, used + want, window, reset_ms}
"""

# KEYS: running zset, the admission window's counter. ARGV: request_id, tokens to refund.
RELEASE_SCRIPT = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local refund = tonumber(ARGV[2])
if refund > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('DECRBY', KEYS[2], refund)
end
return 1
"""


def running_key(tenant_id: str, priority: str) -> str:
    return f"fleetlm:limit:{tenant_id}:{priority}:running"


def tokens_key(tenant_id: str, priority: str) -> str:
    return f"fleetlm:limit:{tenant_id}:{priority}:tpm"


def window_key(tenant_id: str, priority: str, window: int) -> str:
    return f"{tokens_key(tenant_id, priority)}:{window}"


@dataclass(frozen=True, slots=True)
class ClassLimit:
    max_concurrency: int | None = None  # None: unlimited
    tokens_per_minute: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    exceeded: str  # "" | "requests" | "tokens"
    running: int
    tokens_used: int
    window: int
    reset_ms: int  # until the token window rolls over


def reserve_args(limit: ClassLimit, request_id: str, tokens: int, lease_s: float) -> list[Any]:
    return [
        UNLIMITED if limit.max_concurrency is None else limit.max_concurrency,
        UNLIMITED if limit.tokens_per_minute is None else limit.tokens_per_minute,
        tokens,
        request_id,
        lease_s,
    ]


def decision(raw: list) -> Decision:
    admitted, exceeded, running, used, window, reset_ms = raw
    if isinstance(exceeded, bytes):
        exceeded = exceeded.decode()
    return Decision(bool(admitted), exceeded, int(running), int(used), int(window), int(reset_ms))


def release_call(
    tenant_id: str, priority: str, request_id: str, reservation: dict[str, int], used: int
) -> tuple[str, int, str, str, str, int]:
    """Arguments for `redis.eval(*release_call(...))`; works on a pipeline too."""
    refund = max(0, int(reservation["tokens"]) - used)
    return (
        RELEASE_SCRIPT,
        2,
        running_key(tenant_id, priority),
        window_key(tenant_id, priority, int(reservation["window"])),
        request_id,
        refund,
    )
