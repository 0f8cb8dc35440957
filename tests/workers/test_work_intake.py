# Where a worker takes work from (workers/gpu/work_intake.py), on the real Redis with queues played
# by hand: its own, the shared and orphaned (dead or draining) workers' queues merged oldest
# first, other live workers' backlog only when it may steal, interactive before batch, never
# more than its room; dead workers with empty queues are forgotten. And what it publishes of its
# prefix cache (workers/gpu/prefix_publisher.py): deltas, the cap, a rewrite when Redis lost the
# set. The package's worker (conftest.py) reads the real queues and routes: these tests use
# priorities and a routes set of their own.
from __future__ import annotations

import itertools
import time
import uuid

import pytest

from engine.block_hash import hash_hex
from service import streams as p
from service.settings import Settings
from workers.gpu.prefix_publisher import PrefixPublisher
from workers.gpu.work_intake import Intake, forget_call, taken_entries

INTERACTIVE, BATCH = "intake-interactive", "intake-batch"  # priorities no worker reads
ROUTES = "fleetlm:routes:intake-test"


@pytest.fixture
def names(rds):
    made: list[str] = []

    def new(*, alive: bool = True, draining: bool = False) -> str:
        w = f"intake-{uuid.uuid4().hex[:8]}"
        made.append(w)
        for prio in (INTERACTIVE, BATCH, *p.PRIORITIES):
            rds.xgroup_create(p.worker_queue_key(w, prio), p.GROUP, id="0", mkstream=True)
        if alive:
            rds.set(p.alive_key(w), "{}", px=60_000)
        rds.hset(p.stats_key(w), "draining", int(draining))
        return w

    for prio in (INTERACTIVE, BATCH):
        rds.delete(p.queue_key(prio))
        rds.xgroup_create(p.queue_key(prio), p.GROUP, id="0", mkstream=True)
    yield new
    for w in made:
        rds.delete(p.alive_key(w), p.stats_key(w), p.blocks_key(w))
        rds.delete(*(p.worker_queue_key(w, prio) for prio in (INTERACTIVE, BATCH, *p.PRIORITIES)))
    rds.delete(ROUTES, *(p.queue_key(prio) for prio in (INTERACTIVE, BATCH)))


_clock = itertools.count(int(time.time() * 1000) - 60_000)  # ids in the past


def put(rds, queue: str, label: str) -> None:
    """XADD with an id of its own millisecond (entries of one millisecond on different queues
    have no order)."""
    rds.xadd(queue, {"r": label}, id=f"{next(_clock)}-0")


def take(
    rds,
    intake: Intake,
    room: int,
    *,
    steal: bool,
    priorities=(INTERACTIVE,),
    age=0.0,
    overdue=(0, 0),
):
    reply = rds.eval(*intake.take_call(list(priorities), room, steal, age, *overdue))
    return [fields["r"] for _, _, fields in taken_entries(reply)]


def test_own_shared_and_orphaned_queues_oldest_first_then_steals(rds, names):
    me, busy, dead, draining = names(), names(), names(alive=False), names(draining=True)
    q = {w: p.worker_queue_key(w, INTERACTIVE) for w in (me, busy, dead, draining)}
    put(rds, q[busy], "busy-1")
    put(rds, q[dead], "dead-1")
    put(rds, p.queue_key(INTERACTIVE), "shared-1")
    put(rds, q[me], "own-1")
    put(rds, q[draining], "draining-1")
    put(rds, q[busy], "busy-2")
    intake = Intake(me, (busy, dead, draining))
    assert take(rds, intake, 3, steal=False) == ["dead-1", "shared-1", "own-1"]
    assert take(rds, intake, 5, steal=False) == ["draining-1"]
    assert take(rds, intake, 5, steal=True) == ["busy-1", "busy-2"]
    assert take(rds, intake, 5, steal=True) == []
    # Taken entries are pending on the taker, like any read.
    assert rds.xpending(q[busy], p.GROUP)["consumers"] == [{"name": me, "pending": 2}]
    assert intake.how(q[me]) == "routed" and intake.how(q[busy]) == "stolen"
    assert intake.how(p.queue_key(INTERACTIVE)) == "shared"


def test_only_entries_older_than_the_steal_age_are_stolen(rds, names):
    me, busy, dead = names(), names(), names(alive=False)
    put(rds, p.worker_queue_key(busy, INTERACTIVE), "busy-old")
    put(rds, p.worker_queue_key(dead, INTERACTIVE), "dead")
    rds.xadd(p.worker_queue_key(busy, INTERACTIVE), {"r": "busy-new"})  # Redis's clock: now
    intake = Intake(me, (busy, dead))
    assert take(rds, intake, 5, steal=True, age=30.0) == ["dead", "busy-old"]
    assert take(rds, intake, 5, steal=True, age=30.0) == []  # its worker reads it next step
    assert take(rds, intake, 5, steal=True, age=0.0) == ["busy-new"]


def test_interactive_before_batch(rds, names):
    me, other = names(), names()
    put(rds, p.worker_queue_key(me, BATCH), "batch-own")
    put(rds, p.worker_queue_key(other, INTERACTIVE), "interactive-other")
    put(rds, p.queue_key(INTERACTIVE), "interactive-shared")
    intake = Intake(me, (other,))
    got = take(rds, intake, 5, steal=True, priorities=(INTERACTIVE, BATCH))
    assert got == ["interactive-shared", "interactive-other", "batch-own"]


def test_overdue_first_priority_entries_are_taken_past_the_room(rds, names):
    me, other = names(), names()
    own = p.worker_queue_key(me, INTERACTIVE)
    put(rds, own, "old-1")  # ids about a minute old
    put(rds, p.queue_key(INTERACTIVE), "old-2")
    put(rds, p.worker_queue_key(other, INTERACTIVE), "other-old")  # a live worker's: never
    put(rds, own, "old-3")
    put(rds, p.worker_queue_key(me, BATCH), "batch-old")
    rds.xadd(own, {"r": "new"})  # Redis's clock: now
    intake = Intake(me, (other,))
    both = (INTERACTIVE, BATCH)
    # No room: at most two entries, each at least 30 s old, of the first priority only.
    assert take(rds, intake, 0, steal=True, priorities=both, overdue=(2, 30.0)) == [
        "old-1",
        "old-2",
    ]
    # The room first, oldest first; then overdue ones only: the young entry stays.
    assert take(rds, intake, 1, steal=False, priorities=both, overdue=(5, 30.0)) == ["old-3"]
    assert take(rds, intake, 0, steal=False, priorities=both, overdue=(5, 30.0)) == []
    assert take(rds, intake, 5, steal=False, priorities=both) == ["new", "batch-old"]


def test_a_dead_worker_with_empty_queues_is_forgotten(rds, names):
    dead, busy = names(alive=False), names(alive=False)
    rds.sadd(ROUTES, dead, busy)
    put(rds, p.worker_queue_key(busy, "batch"), "left")
    assert rds.eval(*forget_call(dead, ROUTES)) == 1
    assert rds.eval(*forget_call(busy, ROUTES)) == 0  # someone must take its entry first
    assert rds.smembers(ROUTES) == {busy}
    assert not rds.exists(p.worker_queue_key(dead, "interactive"))


class FakeBlocks:
    def __init__(self) -> None:
        self.events: dict[int, bool] = {}
        self.depth = 0

    def track_cache_events(self, depth: int) -> None:
        self.depth = depth

    def take_cache_events(self) -> dict[int, bool]:
        events, self.events = self.events, {}
        return events


def trip(rds, publisher: PrefixPublisher) -> None:
    pipe = rds.pipeline(transaction=False)
    written = publisher.write(pipe)
    publisher.confirm(written, pipe.execute())


def test_published_blocks_follow_the_cache_in_deltas_up_to_the_cap(rds):
    worker = f"pub-{uuid.uuid4().hex[:8]}"
    key = p.blocks_key(worker)
    blocks = FakeBlocks()
    settings = Settings(_env_file=None, routing_max_blocks=7, routing_max_published_blocks=3)
    publisher = PrefixPublisher(blocks, worker, settings, ttl_ms=5000)
    assert blocks.depth == 7
    blocks.events = {1: True, 2: True}
    trip(rds, publisher)
    assert rds.smembers(key) == {hash_hex(1), hash_hex(2)} and 0 < rds.pttl(key) <= 5000
    blocks.events = {1: False, 3: True, 4: True, 5: True}  # one leaves, three come: cap 3
    trip(rds, publisher)
    assert rds.scard(key) == 3 and hash_hex(1) not in rds.smembers(key)
    assert publisher.num_published == 3
    # Redis lost the set: the size read back disagrees, so the next trip writes it whole.
    rds.delete(key)
    trip(rds, publisher)
    assert publisher.rewrite
    trip(rds, publisher)
    assert rds.scard(key) == 3 and not publisher.rewrite
    rds.delete(key)


def test_nothing_is_published_with_routing_off(rds):
    blocks = FakeBlocks()
    publisher = PrefixPublisher(blocks, "w-off", Settings(_env_file=None, routing=False), 5000)
    assert publisher.write(rds.pipeline()) is None and blocks.depth == 0
