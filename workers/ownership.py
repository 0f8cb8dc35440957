# Who runs a request is who holds its queue entry in the consumer group's pending list. A worker
# that stops heartbeating is taken for dead and its entries are claimed (XAUTOCLAIM) by another;
# but a worker only cut off from Redis for a while is still running them. Everything a worker
# does that ends or hands over a request therefore checks, in the same Lua call that does it,
# that the entry is still pending on itself: a worker that lost a request can no longer finish
# it (a second usage record), release its reservation or hand it back to the queue. Its deltas
# are not fenced (one command per token); readers skip them after the claimer's `resume` event
# (service/output_stream.py).
from __future__ import annotations

import json

from metering import ratelimit as rl
from metering.records import METERING_STREAM, RequestRecord, encode_record
from service import streams as p
from service.events import Event, encode_event
from service.queued_request import QueuedRequest

# The entry ARGV[2] of queue KEYS[1] is pending on consumer ARGV[3] of group ARGV[1].
_OWNED = """
local function owned(queue, group, entry, consumer)
  local pending = redis.call('XPENDING', queue, group, entry, entry, 1)
  return #pending > 0 and pending[1][2] == consumer
end
"""

# KEYS: queue, output stream, metering stream, the limits' running zset and token window (both
# '' without a reservation). ARGV: group, entry, worker, final event, output TTL, record kind,
# record, request id, tokens to refund. The final event, the usage record, the reservation's
# release (metering/ratelimit.py's RELEASE_SCRIPT) and the XACK, all or nothing.
FINISH_SCRIPT = (
    _OWNED
    + """
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
redis.call('XADD', KEYS[2], '*', 'e', ARGV[4])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
redis.call('XADD', KEYS[3], '*', 'kind', ARGV[6], 'r', ARGV[7])
if KEYS[4] ~= '' and redis.call('ZREM', KEYS[4], ARGV[8]) == 1 then
  local refund = tonumber(ARGV[9])
  if refund > 0 and redis.call('EXISTS', KEYS[5]) == 1 then
    redis.call('DECRBY', KEYS[5], refund)
  end
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
"""
)

# KEYS: queue, its queued-tokens counter, the queue to hand it to. ARGV: group, entry, worker,
# encoded request, its queued tokens. To the tail of the target queue (the shared queue of its
# priority) as a fresh entry, for any worker to take.
REQUEUE_SCRIPT = (
    _OWNED
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
    _OWNED
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
        running = rl.running_key(req.tenant_id, req.priority)
        window = rl.window_key(req.tenant_id, req.priority, req.reservation.window)
        used = record.counts["prompt_tokens"] + record.counts["completion_tokens"]
        refund = max(0, req.reservation.tokens - used)
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
