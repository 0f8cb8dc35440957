# Where a worker's work comes from, with routing (service/routing.py): per priority, its own
# queue, the shared queue and the queues of workers that are dead or draining (nobody else will
# read those), merged oldest first; then, only when its engine has little waiting
# (steal_max_waiting), the entries of other live workers' backlogs that have waited there at
# least steal_min_age_s (younger ones their worker reads at its next step), oldest first.
# Interactive before batch, and batch only with headroom, as without routing. One Lua call takes
# at most `room` entries in that order and delivers them to this worker in the consumer group,
# so fencing, heartbeats and XAUTOCLAIM treat a taken entry like any other
# (service/queue_ownership.py). Past `room`, it takes up to `overdue_room` more of the first
# priority's own and shared entries that have waited at least overdue_age_s: requests admission
# promised a first token sooner (workers/gpu/intake_budget.py says when and how many).
#
# The set of routed workers (fleetlm:routes) is re-read every heartbeat interval; a worker that
# is dead and whose queues are empty is then removed with its queues and its published blocks.
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from service import streams as p
from service.routing import routed_inflight_field

# KEYS, per priority taken: own queue, shared queue, then per other routed worker: its queue,
# its alive key, its stats hash. ARGV: group, consumer, room, may steal (1/0), the age in ms an
# entry must have to be stolen, the overdue room, the age in ms that makes an entry overdue, then
# per priority the number of other routed workers. Returns {queue, entry id, {field, value, ...}}
# per entry taken.
TAKE_SCRIPT = """
local group, consumer = ARGV[1], ARGV[2]
local room, may_steal = tonumber(ARGV[3]), ARGV[4] == '1'
local now = redis.call('TIME')  -- entry ids carry Redis's clock, not the worker's
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local steal_before = now_ms - tonumber(ARGV[5])
local overdue_room, overdue_before = tonumber(ARGV[6]), now_ms - tonumber(ARGV[7])
local taken = {}

-- The id of the queue's next entry not yet delivered to the group, or nil.
local function head(queue)
  local groups = redis.pcall('XINFO', 'GROUPS', queue)
  if type(groups) ~= 'table' or groups.err then return nil end
  for _, g in ipairs(groups) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    if info['name'] == group then
      local after = redis.call('XRANGE', queue, '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
      if #after > 0 then return after[1][1] end
      return nil
    end
  end
  return nil
end

local function older(a, b)
  local am, as = string.match(a, '(%d+)-(%d+)')
  local bm, bs = string.match(b, '(%d+)-(%d+)')
  if tonumber(am) ~= tonumber(bm) then return tonumber(am) < tonumber(bm) end
  return tonumber(as) < tonumber(bs)
end

-- Entries of `queues`, oldest first, until `limit` are taken in all; with `before` (ms), only
-- older ones.
local function take_oldest(queues, before, limit)
  local heads = {}
  for i, q in ipairs(queues) do heads[i] = head(q) end
  while #taken < limit do
    local pick = nil
    for i = 1, #queues do
      local ok = heads[i] and (before == nil
        or tonumber(string.match(heads[i], '(%d+)-')) <= before)
      if ok and (pick == nil or older(heads[i], heads[pick])) then pick = i end
    end
    if pick == nil then return end
    local got = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 1,
                           'STREAMS', queues[pick], '>')
    if got then
      local entry = got[1][2][1]
      table.insert(taken, {queues[pick], entry[1], entry[2]})
    end
    heads[pick] = head(queues[pick])
  end
end

local k = 1
for i = 8, #ARGV do
  local num_others = tonumber(ARGV[i])
  local mine, busy = {KEYS[k], KEYS[k + 1]}, {}
  for j = 0, num_others - 1 do
    local base = k + 2 + 3 * j
    if redis.call('EXISTS', KEYS[base + 1]) == 1
        and redis.call('HGET', KEYS[base + 2], 'draining') ~= '1' then
      table.insert(busy, KEYS[base])
    else
      table.insert(mine, KEYS[base])
    end
  end
  take_oldest(mine, nil, room)
  if i == 8 and overdue_room > 0 then  -- the first priority's overdue entries, past the room
    take_oldest(mine, overdue_before, room + overdue_room)
  end
  if may_steal then take_oldest(busy, steal_before, room) end
  k = k + 2 + 3 * num_others
end
return taken
"""

# KEYS: the routes set, the worker's alive key, its queues, its blocks set. ARGV: the worker.
# Removes a dead worker whose queues are empty from the routes, with its keys.
FORGET_SCRIPT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
for i = 3, #KEYS - 1 do
  if redis.call('XLEN', KEYS[i]) > 0 then return 0 end
end
redis.call('DEL', unpack(KEYS, 3))
redis.call('SREM', KEYS[1], ARGV[1])
return 1
"""

HOW = ("routed", "shared", "stolen", "reclaimed")  # how a worker came by a request


@dataclass(frozen=True, slots=True)
class Intake:
    """One worker's view of the queues."""

    worker_id: str
    others: tuple[str, ...] = ()  # the other routed workers, as last read

    def own(self, priority: str) -> str:
        return p.worker_queue_key(self.worker_id, priority)

    def routed_inflight(self, running: Iterable[tuple[str, str]], ended: set[str]) -> dict:
        """Stats fields: per priority, how many entries of the worker's own queue it runs
        (`running`: (queue, entry id) of what it holds; `ended`: entry ids this round trip
        acknowledges). Routing subtracts them from the queue's pending entries of this
        consumer, which leaves those read since these stats were written (service/routing.py)."""
        counts = {self.own(prio): 0 for prio in p.PRIORITIES}
        for queue, entry_id in running:
            if queue in counts and entry_id not in ended:
                counts[queue] += 1
        return {routed_inflight_field(prio): counts[self.own(prio)] for prio in p.PRIORITIES}

    def read_streams(self, priorities: Sequence[str]) -> list[str]:
        """What an idle worker blocks on, and polls while a step runs: its own and the shared
        queues."""
        return [q for prio in priorities for q in (self.own(prio), p.queue_key(prio))]

    def all_queues(self, priorities: Sequence[str]) -> list[str]:
        """Every queue an entry of these priorities may be pending on (XAUTOCLAIM's scan)."""
        routes = [self.worker_id, *self.others]
        return [q for prio in priorities for q in p.queue_keys(prio, routes)]

    def take_call(
        self,
        priorities: Sequence[str],
        room: int,
        may_steal: bool,
        steal_min_age_s: float = 0.0,
        overdue_room: int = 0,
        overdue_age_s: float = 0.0,
    ) -> tuple:
        keys: list[str] = []
        counts: list[int] = []
        for prio in priorities:
            keys += [self.own(prio), p.queue_key(prio)]
            for w in self.others:
                keys += [p.worker_queue_key(w, prio), p.alive_key(w), p.stats_key(w)]
            counts.append(len(self.others))
        age_ms, overdue_ms = int(steal_min_age_s * 1000), int(overdue_age_s * 1000)
        args = [p.GROUP, self.worker_id, room, int(may_steal), age_ms, overdue_room, overdue_ms]
        args += counts
        return (TAKE_SCRIPT, len(keys), *keys, *args)

    def how(self, queue: str) -> str:
        if queue.endswith(f":w:{self.worker_id}"):
            return "routed"
        return "stolen" if ":w:" in queue else "shared"


def forget_call(worker_id: str, routes_key: str = p.ROUTES_SET) -> tuple:
    queues = [p.worker_queue_key(worker_id, prio) for prio in p.PRIORITIES]
    keys = [routes_key, p.alive_key(worker_id), *queues, p.blocks_key(worker_id)]
    return (FORGET_SCRIPT, len(keys), *keys, worker_id)


def taken_entries(reply: list) -> list[tuple[str, str, dict]]:
    """The take script's reply as (queue, entry id, fields)."""
    return [(q, entry_id, dict(zip(flat[::2], flat[1::2]))) for q, entry_id, flat in reply]
