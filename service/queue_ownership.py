# Who runs a request is who holds its queue entry in the consumer group's pending list. A worker
# that stops heartbeating is taken for dead and its entries are claimed (XAUTOCLAIM) by another;
# but a worker only cut off from Redis for a while is still running them. Everything a worker
# does that ends or hands over a request therefore checks, in the same Lua call that does it,
# that the entry is still pending on itself: a worker that lost a request can no longer finish
# it (a second usage record), release its reservation or hand it back to the queue. Its deltas
# are not fenced (one command per token); readers skip them after the claimer's `resume` event
# (service/output_stream.py).
#
# Every Lua read of the consumer group's pending lists (XPENDING) is here, as the Lua functions
# below, so that the API (load shedding, routing), the workers and the batch runner agree on who
# holds an entry; the scripts that act on that answer are here too, behind `*_call` functions
# that build their arguments.
from __future__ import annotations

import json
from collections.abc import Sequence

from metering.records import METERING_STREAM, RequestRecord, encode_record
from service import streams as p
from service.events import Event, encode_event
from service.limit_reservations import RELEASE_LUA, release_parts
from service.queued_request import QueuedRequest

# holder: the consumer that holds `entry` of `queue` in `group` (read, not acknowledged), or
# false when nobody does. owned: whether that is `consumer`.
OWNED_LUA = """
local function holder(queue, group, entry)
  local pending = redis.call('XPENDING', queue, group, entry, entry, 1)
  if #pending == 0 then return false end
  return pending[1][2]
end
local function owned(queue, group, entry, consumer)
  return holder(queue, group, entry) == consumer
end
"""

# pending_summary: XPENDING's summary of `queue` in `group` ({count, first, last, {{consumer,
# count}...}}), or nil while the group does not exist on it (an error until a worker reads it).
# num_pending: the entries of a summary held by any consumer; pending_on: those held by one.
PENDING_LUA = """
local function pending_summary(queue, group)
  local info = redis.pcall('XPENDING', queue, group)
  if type(info) ~= 'table' or info.err ~= nil then return nil end
  return info
end
local function num_pending(info)
  if info == nil then return 0 end
  return info[1]
end
local function pending_on(info, consumer)
  if info == nil or type(info[4]) ~= 'table' then return 0 end
  for _, c in ipairs(info[4]) do
    if c[1] == consumer then return tonumber(c[2]) end
  end
  return 0
end
"""

# KEYS: queue, output stream, metering stream, the limits' running zset and token window (both
# '' without a reservation). ARGV: group, entry, worker, final event, output TTL, record kind,
# record, request id, tokens to refund. The final event, the usage record, the reservation's
# release (service/limit_reservations.py's RELEASE_LUA) and the XACK, all or nothing.
FINISH_SCRIPT = (
    OWNED_LUA
    + RELEASE_LUA
    + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
redis.call('XADD', KEYS[2], '*', 'e', ARGV[4])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
redis.call('XADD', KEYS[3], '*', 'kind', ARGV[6], 'r', ARGV[7])
if KEYS[4] ~= '' then release(KEYS[4], KEYS[5], ARGV[8], tonumber(ARGV[9])) end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
"""
)

# KEYS: queue, its queued-tokens counter, the queue to hand it to. ARGV: group, entry, worker,
# encoded request, its queued tokens. To the tail of the target queue (the shared queue of its
# priority) as a fresh entry, for any worker to take.
REQUEUE_SCRIPT = (
    OWNED_LUA
    + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
redis.call('XADD', KEYS[3], '*', 'r', ARGV[4])
redis.call('INCRBY', KEYS[2], tonumber(ARGV[5]))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
"""
)

# KEYS: alive key, workers set, then the queues. ARGV: worker, alive value, TTL ms, group, then
# one "<index of the queue in KEYS>:<entry>" per entry the worker runs. Refreshes the heartbeat,
# resets the idle time of the entries still pending on the worker (XCLAIM JUSTID: no delivery
# count bump) and returns the others: lost to a worker that claimed them meanwhile.
HEARTBEAT_SCRIPT = (
    OWNED_LUA
    + """
redis.call('SET', KEYS[1], ARGV[2], 'PX', tonumber(ARGV[3]))
redis.call('SADD', KEYS[2], ARGV[1])
local lost = {}
for i = 5, #ARGV do
  local sep = string.find(ARGV[i], ':', 1, true)
  local queue = KEYS[tonumber(string.sub(ARGV[i], 1, sep - 1))]
  local entry = string.sub(ARGV[i], sep + 1)
  if owned(queue, ARGV[4], entry, ARGV[1]) then
    redis.call('XCLAIM', queue, ARGV[4], ARGV[1], 0, entry, 'JUSTID')
  else
    table.insert(lost, entry)
  end
end
return lost
"""
)

# KEYS: output stream, cancel flag. ARGV: the claiming worker's resume event, output TTL. Reads
# what the stream holds and appends the resume event in one step, so nothing the previous owner
# still writes can land between what the claimer saw and where it takes over.
TAKEOVER_SCRIPT = """
local events = redis.call('XRANGE', KEYS[1], '-', '+')
redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return {events, redis.call('GET', KEYS[2])}
"""


# KEYS: a queue. ARGV: group, entry. Drops an entry that no worker has read yet: XDEL unless a
# consumer holds it (then the request's cancel key stops it). Returns false when held, '' when
# the entry is gone, else the entry's encoded request.
DROP_UNREAD_SCRIPT = (
    OWNED_LUA
    + """
if holder(KEYS[1], ARGV[1], ARGV[2]) then return false end
local entry = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if #entry == 0 then return '' end
return entry[1][2][2]
"""
)

# KEYS: per priority, its token counter then its queues (shared and routed). ARGV: the group,
# then per priority how many queues it has. Returns each counter; one whose queues have nothing
# undelivered (every entry pending on a worker) is reset to 0 first, which heals the drift a
# worker that died between reading entries and reporting them leaves behind.
QUEUED_TOKENS_SCRIPT = (
    PENDING_LUA
    + """
local out = {}
local k = 1
for i = 2, #ARGV do
  local counter, num_queues = KEYS[k], tonumber(ARGV[i])
  local tokens = tonumber(redis.call('GET', counter) or '0')
  if tokens ~= 0 then
    local undelivered = 0
    for q = k + 1, k + num_queues do
      local info = pending_summary(KEYS[q], ARGV[1])
      undelivered = undelivered + redis.call('XLEN', KEYS[q]) - num_pending(info)
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
)


def finish_call(
    req: QueuedRequest,
    queue: str,
    entry_id: str,
    worker_id: str,
    event: Event,
    ttl_s: int,
    record: RequestRecord,
) -> tuple:
    """Arguments for `pipe.eval(*finish_call(...))`."""
    fields = encode_record(record)
    running = window = ""
    refund = 0
    if req.reservation is not None:
        used = record.counts["prompt_tokens"] + record.counts["completion_tokens"]
        running, window, refund = release_parts(req.tenant_id, req.priority, req.reservation, used)
    return (
        FINISH_SCRIPT, 5, queue, p.output_key(req.request_id), METERING_STREAM, running, window,
        p.GROUP, entry_id, worker_id, encode_event(event)["e"], ttl_s, fields["kind"],
        fields["r"], req.request_id, refund,
    )  # fmt: skip


def requeue_call(req: QueuedRequest, queue: str, entry_id: str, worker_id: str) -> tuple:
    return (
        REQUEUE_SCRIPT, 3, queue, p.queued_tokens_key(req.priority), p.queue_key(req.priority),
        p.GROUP, entry_id, worker_id, req.encode(), req.queued_tokens,
    )  # fmt: skip


def heartbeat_call(
    worker_id: str,
    info: dict,
    ttl_ms: int,
    owned: list[tuple[str, str]],
    queues: list[str] | None = None,
) -> tuple:
    """`owned`: (queue, entry id) of every request the worker runs, on `queues` (the queues
    those entries are on unless told)."""
    queues = queues or list(dict.fromkeys(queue for queue, _ in owned))
    entries = [f"{queues.index(queue) + 3}:{entry}" for queue, entry in owned]
    return (
        HEARTBEAT_SCRIPT, 2 + len(queues), p.alive_key(worker_id), p.WORKERS_SET, *queues,
        worker_id, json.dumps(info), ttl_ms, p.GROUP, *entries,
    )  # fmt: skip


def takeover_call(request_id: str, worker_id: str, ttl_s: int) -> tuple:
    resume = {"type": "resume", "worker": worker_id}
    return (
        TAKEOVER_SCRIPT, 2, p.output_key(request_id), p.cancel_key(request_id),
        encode_event(resume)["e"], ttl_s,
    )  # fmt: skip


def drop_unread_call(queue: str, entry_id: str) -> tuple:
    """Arguments for `redis.eval(*drop_unread_call(...))`: see DROP_UNREAD_SCRIPT."""
    return (DROP_UNREAD_SCRIPT, 1, queue, p.GROUP, entry_id)


def queued_tokens_call(routes: Sequence[str]) -> tuple:
    """Arguments for `redis.eval(*queued_tokens_call(...))`, whose reply is the tokens queued
    and not yet read per priority, in p.PRIORITIES' order (QUEUED_TOKENS_SCRIPT)."""
    keys: list[str] = []
    for priority in p.PRIORITIES:
        keys += [p.queued_tokens_key(priority), *p.queue_keys(priority, list(routes))]
    sizes = [len(routes) + 1] * len(p.PRIORITIES)
    return (QUEUED_TOKENS_SCRIPT, len(keys), *keys, p.GROUP, *sizes)
