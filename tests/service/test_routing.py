# The routing decision (service/routing.py) on the embedded Redis, with workers played by their
# keys: a prompt goes to the worker holding its longest prefix, unless that worker is loaded by
# more than the prefix saves; dead and draining workers get nothing; no worker (or routing off)
# means the shared queue; the queue limit counts every queue of the priority.
from __future__ import annotations

import uuid

import pytest
import redis

from engine.block_hash import hash_hex, prefix_block_hashes
from service import streams as p
from service.routing import route_call, routed, routed_inflight_field
from service.settings import Settings
from tests.wire import queued_request

BS = 16
PROMPT = list(range(100, 100 + 8 * BS + 3))  # 8 full blocks, the last one partial


class Fleet:
    def __init__(self, rds: redis.Redis) -> None:
        self.rds = rds
        self.ids: list[str] = []

    def worker(self, *, used: int = 0, waiting_tokens: int = 0, draining: bool = False) -> str:
        w = f"route-{uuid.uuid4().hex[:8]}"
        self.ids.append(w)
        for prio in p.PRIORITIES:
            self.rds.xgroup_create(p.worker_queue_key(w, prio), p.GROUP, id="0", mkstream=True)
        self.rds.set(p.alive_key(w), "{}", px=60_000)
        self.rds.hset(p.stats_key(w), mapping={
            "num_free_blocks": 1000 - used, "num_total_blocks": 1000, "draining": int(draining),
            "num_waiting_tokens": waiting_tokens,
        })  # fmt: skip
        return w

    def holds(self, w: str, tenant: str, num_blocks: int) -> None:
        hashes = prefix_block_hashes(PROMPT, BS, tenant)[:num_blocks]
        self.rds.sadd(p.blocks_key(w), *map(hash_hex, hashes))

    def route(
        self, tenant: str, settings: Settings | None = None, prompt=PROMPT, out_tokens: int = 0
    ):
        settings = settings or Settings(_env_file=None, block_size=BS)
        queued = queued_request(list(prompt))
        queued.tenant_id = tenant
        queued.queued_tokens = len(prompt) + out_tokens  # prompt + expected output
        reply = self.rds.eval(*route_call(queued, settings, self.ids, limit=1000))
        return routed(reply, self.ids, "interactive")

    def clean(self) -> None:
        for w in self.ids:
            keys = [p.alive_key(w), p.stats_key(w), p.blocks_key(w)]
            self.rds.delete(*keys, *(p.worker_queue_key(w, prio) for prio in p.PRIORITIES))


@pytest.fixture
def fleet(rds):
    rds.delete(p.queue_key("interactive"))
    f = Fleet(rds)
    yield f
    f.clean()
    rds.delete(p.queue_key("interactive"))


def test_the_worker_holding_the_longest_prefix_gets_the_request(fleet):
    a, b, c = fleet.worker(), fleet.worker(), fleet.worker()
    fleet.holds(a, "t1", 3)
    fleet.holds(b, "t1", 6)
    fleet.holds(c, "t2", 8)  # another tenant's cache is no use
    got = fleet.route("t1")
    assert (got.worker_id, got.matched_blocks) == (b, 6)
    assert got.queue == p.worker_queue_key(b, "interactive")
    assert fleet.rds.xlen(got.queue) == 1


def test_a_prefix_loses_to_load_heavier_than_it_saves(fleet):
    a, b = fleet.worker(used=0), fleet.worker(used=30)
    fleet.holds(b, "t1", 8)
    # b saves 8 blocks of prefill (weight 2) and the 8 KV blocks its cached prefix shares, but
    # runs 30 more KV blocks of decodes than a.
    assert fleet.route("t1").worker_id == a
    # Queued prefill weighs the same way: a's waiting tokens cost it the request.
    fleet.rds.hset(p.stats_key(b), "num_free_blocks", 1000 - 5)
    fleet.rds.hset(p.stats_key(a), "num_waiting_tokens", 10 * BS)
    assert fleet.route("t1").worker_id == b
    # A heavier prefill weight favours the cache.
    fleet.rds.hset(p.stats_key(a), "num_waiting_tokens", 0)
    fleet.rds.hset(p.stats_key(b), "num_free_blocks", 1000 - 30)
    heavy = Settings(_env_file=None, block_size=BS, routing_prefill_weight=4.0)
    assert fleet.route("t1", heavy).worker_id == b


def test_entries_waiting_on_a_worker_queue_count_as_its_load(fleet):
    a, b = fleet.worker(), fleet.worker()
    fleet.holds(a, "t1", 4)  # saves 4 of 9 blocks
    first = fleet.route("t1")
    assert first.worker_id == a
    # One entry waiting on a's queue costs it the 5 blocks the request would prefill there.
    assert fleet.route("t1").worker_id == b


def test_an_entry_its_worker_read_counts_until_its_stats_show_it(fleet):
    a, b = fleet.worker(), fleet.worker()
    fleet.holds(a, "t1", 4)
    for w in (a, b):
        fleet.rds.hset(p.stats_key(w), routed_inflight_field("interactive"), 0)
    assert fleet.route("t1").worker_id == a
    queue = p.worker_queue_key(a, "interactive")
    # a reads it (pending on a's consumer) before its next stats: still a's load.
    fleet.rds.xreadgroup(p.GROUP, a, {queue: ">"})
    assert fleet.route("t1").worker_id == b
    fleet.rds.xtrim(p.worker_queue_key(b, "interactive"), maxlen=0)
    # Its stats now show it, waiting in its engine: the load is seen there instead.
    fleet.rds.hset(p.stats_key(a), mapping={
        routed_inflight_field("interactive"): 1, "num_waiting_tokens": len(PROMPT),
    })  # fmt: skip
    assert fleet.route("t1").worker_id == b
    fleet.rds.xtrim(p.worker_queue_key(b, "interactive"), maxlen=0)
    # Done and acknowledged, a is idle again and its prefix wins.
    entry = fleet.rds.xrange(queue)[0][0]
    fleet.rds.xack(queue, p.GROUP, entry)
    fleet.rds.xdel(queue, entry)
    fleet.rds.hset(p.stats_key(a), mapping={
        routed_inflight_field("interactive"): 0, "num_waiting_tokens": 0,
    })  # fmt: skip
    assert fleet.route("t1").worker_id == a


def test_an_entry_another_worker_took_is_not_its_queues_load(fleet):
    a, b = fleet.worker(), fleet.worker()
    fleet.holds(a, "t1", 4)
    fleet.rds.hset(p.stats_key(a), routed_inflight_field("interactive"), 0)
    assert fleet.route("t1").worker_id == a
    # b steals it: pending on b's consumer, in b's load (its stats), not on a.
    fleet.rds.xreadgroup(p.GROUP, b, {p.worker_queue_key(a, "interactive"): ">"})
    assert fleet.route("t1").worker_id == a


def test_the_output_of_entries_ahead_weighs_on_their_worker(fleet):
    a, b = fleet.worker(), fleet.worker()
    fleet.holds(a, "t1", 8)  # saves 8 of 9 blocks
    fleet.route("t1")  # one entry waits on a's queue
    # Short answers: the entry ahead costs a little, the prefix wins.
    assert fleet.route("t1").worker_id == a
    fleet.rds.xtrim(p.worker_queue_key(a, "interactive"), maxlen=1)
    # 30 blocks of output each: the entries ahead will hold 30 KV blocks apiece on a, more
    # than the 8 blocks of prefill and 8 of KV the prefix saves.
    assert fleet.route("t1", out_tokens=30 * BS).worker_id == b


def test_dead_and_draining_workers_get_nothing_and_no_worker_means_the_shared_queue(fleet):
    dead, draining = fleet.worker(), fleet.worker(draining=True)
    for w in (dead, draining):
        fleet.holds(w, "t1", 8)
    fleet.rds.delete(p.alive_key(dead))
    got = fleet.route("t1")
    assert (got.worker_id, got.queue) == (None, p.queue_key("interactive"))
    live = fleet.worker()
    assert fleet.route("t1").worker_id == live


def test_routing_off_uses_the_shared_queue(fleet):
    a = fleet.worker()
    fleet.holds(a, "t1", 8)
    off = Settings(_env_file=None, block_size=BS, routing=False)
    assert fleet.route("t1", off).worker_id is None


def test_ties_are_spread_over_the_workers(fleet):
    workers = {fleet.worker() for _ in range(3)}
    short = list(range(5))  # no full block: nothing to match, every worker idle
    chosen = set()
    for _ in range(30):
        got = fleet.route("t1", prompt=short)
        fleet.rds.xtrim(got.queue, maxlen=0)  # keep them equally loaded
        chosen.add(got.worker_id)
    assert chosen == workers


def test_the_queue_limit_counts_every_queue_of_the_priority(fleet):
    a, b = fleet.worker(), fleet.worker()
    settings = Settings(_env_file=None, block_size=BS)
    fleet.rds.xadd(p.queue_key("interactive"), {"r": "x"})
    fleet.rds.xadd(p.worker_queue_key(a, "interactive"), {"r": "x"})
    queued = queued_request(PROMPT)
    assert fleet.rds.eval(*route_call(queued, settings, [a, b], limit=3)) is not None
    assert fleet.rds.eval(*route_call(queued, settings, [a, b], limit=3)) is None
