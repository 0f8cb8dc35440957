# Prefix-aware routing: admission puts a request on the queue of the worker that will serve it
# soonest, counting what its prefix cache already holds. Each worker publishes the hashes of the
# prefix blocks it holds (fleetlm:worker:{id}:blocks, engine/block_hash.py's chained,
# tenant-salted hashes of the first routing_max_blocks blocks of each cached prefix) and its load
# (its stats hash, rewritten every step). For a prompt of n blocks whose leading m blocks a
# worker holds, and which is expected to write o blocks of output, its cost is
#
#   prefill_weight × ((n − m) + queued prefill blocks) + KV blocks in use
#     + (1 + queued entries) × ((n − m) + o)
#
# The queued prefill is its engine's waiting tokens in blocks plus the entries on its own queue
# that its stats do not show yet, each counted as n − m blocks, like this one: the entries no
# worker has read, and those it read since it last wrote its stats (XPENDING of its consumer
# less the entries of that queue it runs, as its stats say). Without the second part a worker
# that reads its queue at once looks idle for a whole step, and a burst for one hot prefix
# all lands on it. The KV blocks in use are its running requests' (decode load); the last term
# is the KV this request and the queued ones will add there (the blocks a cached prefix shares
# are not added). The cheapest live, non-draining worker gets the request; ties go to a random
# one. A cached prefix therefore wins while its worker is no more loaded than the prefix saves,
# and one hot prefix spills over to the other workers as its worker fills up.
# With routing off, or no live worker, the request goes to the shared queue of its priority.
#
# One Lua call decides and enqueues, atomic against the queue limit (the priority's entries on
# every queue: shared and routed) and against other API processes' decisions. Workers that run
# out of their own work also take from the shared queues and from busier workers' queues
# (workers/gpu/work_intake.py), so a routing mistake costs a cache miss, never an idle GPU.
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from engine.block_hash import hash_hex, prefix_block_hashes
from service import streams as p
from service.queue_ownership import PENDING_LUA
from service.queued_request import QueuedRequest
from service.settings import Settings


def routed_inflight_field(priority: str) -> str:
    """The stats-hash field in which a worker counts the entries of its own queue of this
    priority that it runs (taken and not yet acknowledged)."""
    return f"routed_inflight_{priority}"


# KEYS: the shared queue, its queued-tokens counter, then per route: its queue of this priority,
# its alive key, its stats hash, its blocks set. ARGV: queue limit, encoded request, queued
# tokens, routing on (1/0), prompt blocks, block size, prefill weight, the route to look at
# first (ties go to the first seen), expected output blocks, the stats field counting the
# worker's entries of this queue (routed_inflight_field), then the routes' worker ids (their
# consumer names), then the prompt's leading block hashes.
# Returns false when the queue limit is reached, else {entry id, queue, matched blocks}.
ROUTE_SCRIPT = (
    PENDING_LUA
    + """
local total = redis.call('XLEN', KEYS[1])
local num_routes = (#KEYS - 2) / 4
local hashes = {}
for i = 11 + num_routes, #ARGV do hashes[#hashes + 1] = ARGV[i] end
local num_blocks, block_size = tonumber(ARGV[5]), tonumber(ARGV[6])
local weight, first = tonumber(ARGV[7]), tonumber(ARGV[8])
local out_blocks, inflight_field = tonumber(ARGV[9]), ARGV[10]

local target, best, best_matched = KEYS[1], nil, 0
for j = 0, num_routes - 1 do
  local route = (j + first) % num_routes
  local base = 2 + 4 * route
  local queue = KEYS[base + 1]
  local length = redis.call('XLEN', queue)
  total = total + length
  if ARGV[4] == '1' and redis.call('EXISTS', KEYS[base + 2]) == 1 then
    local s = redis.call('HMGET', KEYS[base + 3], 'draining', 'num_free_blocks',
                         'num_total_blocks', 'num_waiting_tokens', inflight_field)
    if s[2] and s[1] ~= '1' then
      local matched = 0
      if #hashes > 0 then
        local found = redis.call('SMISMEMBER', KEYS[base + 4], unpack(hashes))
        while matched < #found and found[matched + 1] == 1 do matched = matched + 1 end
      end
      local info = pending_summary(queue, 'workers')
      local entries = math.max(length - num_pending(info), 0)
      if s[5] then  -- read by the worker since its stats were written
        local mine = pending_on(info, ARGV[11 + route])
        entries = entries + math.max(mine - tonumber(s[5]), 0)
      end
      local uncached = num_blocks - matched
      local queued = math.ceil(tonumber(s[4] or '0') / block_size) + entries * uncached
      local cost = weight * (uncached + queued) + tonumber(s[3]) - tonumber(s[2])
      cost = cost + (1 + entries) * (uncached + out_blocks)
      if best == nil or cost < best then
        target, best, best_matched = queue, cost, matched
      end
    end
  end
end
if total >= tonumber(ARGV[1]) then return false end
redis.call('INCRBY', KEYS[2], tonumber(ARGV[3]))
return {redis.call('XADD', target, '*', 'r', ARGV[2]), target, best_matched}
"""
)


@dataclass(frozen=True, slots=True)
class Routed:
    entry_id: str
    queue: str
    worker_id: str | None  # None: the shared queue
    matched_blocks: int


def route_call(
    queued: QueuedRequest, settings: Settings, routes: Sequence[str], *, limit: int
) -> tuple:
    """Arguments for `redis.eval(*route_call(...))`."""
    priority = queued.priority
    keys = [p.queue_key(priority), p.queued_tokens_key(priority)]
    for w in routes:
        keys += [p.worker_queue_key(w, priority), p.alive_key(w), p.stats_key(w), p.blocks_key(w)]
    bs = settings.block_size
    hashes: list[str] = []
    if settings.routing and routes and settings.enable_prefix_caching:
        tokens = queued.prompt_token_ids
        found = prefix_block_hashes(tokens, bs, queued.tenant_id, settings.routing_max_blocks)
        hashes = [hash_hex(h) for h in found]
    num_prompt = len(queued.prompt_token_ids)
    num_blocks = -(-num_prompt // bs)
    # queued_tokens is the prompt and the expected output (service/admission.py).
    out_blocks = -(-max(queued.queued_tokens - num_prompt, 0) // bs)
    first = random.randrange(len(routes)) if routes else 0
    argv = [
        limit, queued.encode(), queued.queued_tokens, int(settings.routing), num_blocks, bs,
        settings.routing_prefill_weight, first, out_blocks, routed_inflight_field(priority),
        *routes, *hashes,
    ]  # fmt: skip
    return (ROUTE_SCRIPT, len(keys), *keys, *argv)


def routed(reply: list, routes: Sequence[str], priority: str) -> Routed:
    entry_id, queue, matched = (_text(x) for x in reply)
    worker = next((w for w in routes if p.worker_queue_key(w, priority) == queue), None)
    return Routed(entry_id, queue, worker, int(matched))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
