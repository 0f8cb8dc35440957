# The per-step Redis round trip of a GPU worker: one pipelined trip publishes what the outbox
# holds (deltas, finishes, fails, hand-backs), reads cancel flags, writes the engine's stats and
# the prefix blocks it cached or evicted (workers/gpu/prefix_publisher.py), XAUTOCLAIMs the
# entries of dead workers and re-reads the routed workers now and then, and takes new work
# (workers/gpu/work_intake.py); `apply` then acts on what came back. A trip Redis did not take
# leaves everything in the outbox for the next one.
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis

from engine import LLMEngine
from service import streams as p
from service.redis_clients import UNREACHABLE, Backoff
from service.settings import Settings
from workers.gpu.client_leases import ClientLeaseWatch
from workers.gpu.exchange import Exchange, checked
from workers.gpu.heartbeat import Heartbeat
from workers.gpu.inflight import Inflight, owned_entries
from workers.gpu.intake_budget import IntakeBudget, intake_budget
from workers.gpu.load_report import LoadReport
from workers.gpu.metrics import WorkerMetrics
from workers.gpu.metrics_publisher import MetricsPublisher
from workers.gpu.outbox import Outbox, Written
from workers.gpu.prefix_publisher import PrefixPublisher
from workers.gpu.queue_admission import QueueAdmission
from workers.gpu.redis_outage import RedisOutage
from workers.gpu.step_prices import StepPrices
from workers.gpu.step_timing import StepTiming
from workers.gpu.usage import BusyMeter
from workers.gpu.work_intake import Intake, forget_call, taken_entries
from workers.gpu.worker_counts import WorkerCounts

log = logging.getLogger("fleetlm.worker")


@dataclass(slots=True)
class PendingTrip:
    exchange: Exchange
    future: Future | None  # None: sent and read in finish(), on the caller's thread


def _execute(pipe) -> tuple[list, float]:
    """Send the pipeline and read its replies (the only part of a trip off the loop's thread:
    it touches nothing of the worker's). Returns them and the seconds it took."""
    t0 = time.perf_counter()
    replies = pipe.execute(raise_on_error=False)
    return replies, time.perf_counter() - t0


def until_redis_answers(stopping: threading.Event, call: Callable[[], Any]) -> Any:
    """`call()`, retried with back-off while Redis is unreachable (until `stopping`)."""
    backoff = Backoff()
    while not stopping.is_set():
        try:
            return call()
        except UNREACHABLE as exc:
            log.warning("redis unreachable (%s); retrying", exc.__class__.__name__)
            stopping.wait(backoff.next_s())
    return None


class RoundTrip:
    """A GPU worker's exchange with Redis: it owns what only the exchange needs (the routed
    workers' queues, the prefix blocks published, the XAUTOCLAIM scan, the intake budget,
    the outage) and is handed the worker's parts it reads and writes."""

    def __init__(
        self,
        *,
        settings: Settings,
        worker_id: str,
        redis_client: redis.Redis,
        engine: LLMEngine,
        inflight: dict[str, Inflight],
        lock: threading.Lock,
        outbox: Outbox,
        counts: WorkerCounts,
        took: Callable[[str], None],
        admission: QueueAdmission,
        leases: ClientLeaseWatch,
        heartbeat: Heartbeat,
        busy: BusyMeter,
        load: LoadReport,
        prices: StepPrices,
        metrics: WorkerMetrics,
        metrics_publisher: MetricsPublisher,
        step_timing: StepTiming,
        draining: threading.Event,
        stopping: threading.Event,
    ) -> None:
        self.settings, self.worker_id = settings, worker_id
        self.redis, self.engine = redis_client, engine
        self.inflight, self.lock, self.outbox, self.counts = inflight, lock, outbox, counts
        self.took, self.admission, self.leases, self.heartbeat = took, admission, leases, heartbeat
        self.busy, self.load, self.prices, self.step_timing = busy, load, prices, step_timing
        self.metrics, self.metrics_publisher = metrics, metrics_publisher
        self.draining, self.stopping = draining, stopping
        self.outage = RedisOutage()
        self.dead_after_ms = int(settings.worker_dead_after_s * 1000)
        self.intake = Intake(worker_id)  # its queues, and the other routed workers'
        self.prefix = PrefixPublisher(engine.block_manager, worker_id, settings, self.dead_after_ms)
        self.budget: IntakeBudget | None = None  # the last turn's (workers/gpu/intake_budget.py)
        self._reclaim_after = 0.0  # monotonic: no XAUTOCLAIM before (others' heartbeats resume)
        self._last_reclaim = 0.0
        self._claim_cursor: dict[str, str] = {}  # queue → XAUTOCLAIM scan position
        self._took_nothing = False  # the last take found nothing: an idle worker may block
        self._io: ThreadPoolExecutor | None = None  # start(in_background=True)'s one thread

    def close(self) -> None:
        if self._io is not None:
            self._io.shutdown(wait=True)

    def create_groups(self) -> None:
        # Stats before the first heartbeat: a worker seen alive always has them; alive before
        # it joins the routes, where a worker without a heartbeat counts as gone.
        stats_key = p.stats_key(self.worker_id)
        self.redis.hset(stats_key, mapping=self._stats_mapping(self.engine.stats()))
        self.redis.expire(stats_key, 60)
        self.heartbeat.beat()
        self._register()

    def _register(self) -> None:
        """The consumer group on the shared queues and on this worker's own (routed) queues,
        and the worker in the routes set."""
        for priority in p.PRIORITIES:
            for queue in (p.queue_key(priority), self.intake.own(priority)):
                try:
                    self.redis.xgroup_create(queue, p.GROUP, id="0", mkstream=True)
                except redis.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
        self.redis.sadd(p.ROUTES_SET, self.worker_id)

    def _update_routes(self, members: set[str]) -> None:
        others = tuple(sorted(w for w in members if w != self.worker_id))
        self.intake = Intake(self.worker_id, others)
        if self.worker_id not in members and not self.draining.is_set():
            # Taken for dead while cut off from Redis (its queues were removed): register again.
            with contextlib.suppress(*UNREACHABLE):
                self._register()

    def run(self, *, busy: bool) -> tuple[Exchange, list] | None:
        """Publish what waits, read cancels and new work: one pipelined round trip. `busy`: a
        step is running, so the read must not block. None when Redis did not answer."""
        return self.finish(self.start(busy=busy))

    def start(self, *, busy: bool, in_background: bool = False) -> PendingTrip:
        """Build the trip here (it reads the engine and the worker's state) and send it, on the
        exchange thread with `in_background` (finish() collects it): the trip's wait for Redis
        (~10 ms at 200 running with `appendfsync always` on the H200's host, the largest part of
        a host-bound turn) then overlaps the finished step's bookkeeping."""
        t0 = time.perf_counter()
        exchange = self.build(busy=busy)
        exchange.build_s = time.perf_counter() - t0
        if not in_background:
            return PendingTrip(exchange, None)
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="exchange")
        return PendingTrip(exchange, self._io.submit(_execute, exchange.pipe))

    def finish(self, pending: PendingTrip) -> tuple[Exchange, list] | None:
        """The trip's replies (waiting for them), checked and confirmed; None when Redis did
        not answer (everything stays in the outbox for the next trip)."""
        exchange = pending.exchange
        try:
            if pending.future is None:
                replies, exchange.io_s = _execute(exchange.pipe)
            else:
                replies, exchange.io_s = pending.future.result()
            results = checked(exchange, replies)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # A Redis that came back without the queues' consumer group (a replica promoted
            # from an empty one, say): recreate it; what this trip carried is sent again.
            log.warning("the queues' consumer group is gone; recreating it")
            until_redis_answers(self.stopping, self.create_groups)
            self.prefix.rewrite = True
            return None
        except UNREACHABLE as exc:
            if self.outage.began():
                log.warning("redis unreachable (%s): pausing the engine", exc.__class__.__name__)
            return None
        lasted = self.outage.lasted()
        if self.outage.over():
            log.info("redis is back after %.1fs", lasted)
            # Every heartbeat lapsed meanwhile: give the other workers time to renew theirs
            # before taking their entries for dead ones.
            self._reclaim_after = time.monotonic() + self.settings.worker_dead_after_s
            self.leases.reset()
        self.confirm(exchange)
        self.prefix.confirm(exchange.blocks, results)
        if exchange.idle and exchange.at_read < 0 and not exchange.num_read(results):
            time.sleep(0.01)  # nothing to step and nothing read: do not spin
        return exchange, results

    def build(self, *, busy: bool, final: bool = False) -> Exchange:
        pipe = self.redis.pipeline(transaction=False)
        if self.outbox.busy_record is None:
            self.outbox.busy_record = self.busy.due()
        exchange = Exchange(pipe=pipe, written=self.outbox.write(pipe, self.inflight))
        if final:
            return exchange

        exchange.ids = ids = list(self.inflight)
        exchange.at_cancels = len(pipe)
        if ids:
            pipe.mget([p.cancel_key(i) for i in ids])
            exchange.at_leases = len(pipe)
            exchange.leased = self.leases.read(pipe, ids)
        stats = self.engine.stats()
        self.budget = budget = intake_budget(self.engine, self.prices, self.load, self.settings)
        self.engine.scheduler.batch_kv_reserve = budget.batch_kv_reserve
        self.load.on_seats(budget.interactive_demand, budget.seats, time.monotonic())
        self.metrics.on_budget(budget)
        mapping = self._stats_mapping(stats) | self._routed_inflight(exchange.written)
        pipe.hset(p.stats_key(self.worker_id), mapping=mapping)
        pipe.expire(p.stats_key(self.worker_id), 60)
        exchange.blocks = self.prefix.write(pipe)
        self.metrics.published_blocks.set(self.prefix.num_published)
        if self.metrics.snapshot_due(stats, self.draining.is_set()):
            self.metrics_publisher.submit()  # serialised and written off this thread

        # Only what the engine can start at the TPOT target (workers/gpu/intake_budget.py); batch
        # work only with headroom, leaving room for an interactive arrival (which would
        # otherwise preempt it), and then no more than that room this turn.
        room, overdue = budget.interactive_room, budget.overdue_room
        if self.draining.is_set() or self.outage.active:
            room = overdue = 0
        priorities = ["interactive"]
        if room > 0 and budget.batch_room > 0:
            priorities.append("batch")
            room = min(room, budget.batch_room)
        intake: Intake = self.intake
        streams = intake.read_streams(priorities)
        exchange.at_reclaim = len(pipe)
        now = time.monotonic()
        reclaim = (
            not self.draining.is_set()
            and not self.outage.active
            and now >= self._reclaim_after
            and now - self._last_reclaim > self.settings.heartbeat_interval_s
        )
        if reclaim:
            # Even when full: a stream whose worker died is waited on by its client.
            self._last_reclaim = now
            exchange.streams = intake.all_queues(priorities)
            for queue in exchange.streams:
                start = self._claim_cursor.get(queue, "0-0")
                pipe.xautoclaim(
                    queue, p.GROUP, self.worker_id, self.dead_after_ms, start, count=max(room, 2)
                )
            for other in intake.others:  # a dead worker whose queues are empty: forget it
                pipe.eval(*forget_call(other))
            exchange.at_routes = len(pipe)
            pipe.smembers(p.ROUTES_SET)
        exchange.idle = idle = not busy and not self.engine.has_unfinished()
        if room > 0 and idle and self._took_nothing:
            # Nothing to do and the last take found nothing: block on the worker's own and the
            # shared queues (bounded, so stop requests are seen); the next trip takes again.
            exchange.at_read = len(pipe)
            block = int(self.settings.heartbeat_interval_s * 500)
            pipe.xreadgroup(
                p.GROUP, self.worker_id, dict.fromkeys(streams, ">"), count=room, block=block
            )
        elif room > 0 or overdue > 0:
            steal = self.settings.steal_max_waiting
            may_steal = steal >= 0 and stats.num_waiting <= steal
            exchange.at_take = len(pipe)
            age, bound = self.settings.steal_min_age_s, self.settings.max_queue_wait_s
            pipe.eval(*intake.take_call(priorities, room, may_steal, age, overdue, bound))
        exchange.read_streams, exchange.room = streams, max(room, 0)
        return exchange

    def confirm(self, exchange: Exchange) -> None:
        """Redis took the round trip: what it carried leaves the outbox."""
        self.outbox.confirm(exchange.written)
        for f, record in exchange.written.finished:
            with self.lock:
                self.inflight.pop(f.request_id, None)
            self.metrics.forget(f.request_id, f.req.sampling.n)
            completion = record.counts["completion_tokens"]
            if record.status in ("completed", "length"):
                counts = record.counts
                self.load.on_finished(
                    completion, counts["prompt_tokens"], counts.get("cached_tokens", 0)
                )
            log.info(
                "request finished",
                extra={
                    "request_id": f.request_id,
                    "tenant_id": f.req.tenant_id,
                    "status": record.status,
                    "completion_tokens": completion,
                },
            )

    def apply(self, exchange: Exchange, results: list, row: int, polled: list = ()) -> None:
        """What a round trip (and the polls after it) read: requests lost to another worker,
        cancels, new requests."""
        t0 = time.perf_counter()
        self._drop_lost()
        if exchange.ids:
            for request_id, flag in zip(exchange.ids, results[exchange.at_cancels]):
                if flag is None:
                    continue
                f = self.inflight.get(request_id)
                if f is not None and f.cancel_delivered is None:
                    f.cancel_delivered = p.delivered_of(flag)
                if self.engine.abort(request_id):
                    self.counts.last_cancel_step = self.counts.num_steps
                    log.info("cancelled %s", request_id)
        if exchange.leased and self.leases.check(exchange.leased, results[exchange.at_leases]):
            self.counts.last_cancel_step = self.counts.num_steps
        if exchange.streams:
            claims = results[exchange.at_reclaim : exchange.at_reclaim + len(exchange.streams)]
            for queue, claimed in zip(exchange.streams, claims):
                if isinstance(claimed, redis.ResponseError):
                    continue  # a dead worker's queue, removed since the routes were read
                self._claim_cursor[queue] = claimed[0]
                self.admission.admit_reclaimed(queue, claimed[1])
        if exchange.at_routes >= 0:
            self._update_routes(results[exchange.at_routes])
        taken: list = []
        if exchange.at_take >= 0:
            taken = taken_entries(results[exchange.at_take])
            self._took_nothing = not taken
        if exchange.at_read >= 0:
            read = results[exchange.at_read] or []
            taken = [(q, i, f) for q, entries in read for i, f in entries]
            self._took_nothing = False
        for queue, entry_id, fields in [*taken, *polled]:
            self.took(self.intake.how(queue))
            self.admission.admit(queue, entry_id, fields, counted=True)
        if exchange.at_take >= 0 and len(taken) > exchange.room:
            self.metrics.taken_overdue.inc(len(taken) - exchange.room)
        budget, seats = self.budget, self.budget.seats_free if self.budget else None
        self.step_timing.add(
            row, exchange_build_s=exchange.build_s, exchange_io_s=exchange.io_s,
            apply_s=time.perf_counter() - t0, room=exchange.room, taken=len(taken) + len(polled),
            max_running=budget.max_running if budget else math.nan,
            seat_over=seats.over if seats else math.nan,
            mean_output=self.load.mean_output_tokens,
            mean_uncached_prompt=self.load.mean_uncached_prompt_tokens,
            price_scale=self.prices.scale,
        )  # fmt: skip

    def _drop_lost(self) -> None:
        """Requests another worker claimed while this one was cut off: it runs them now (and
        bills them); stop them here without a word."""
        lost = self.heartbeat.take_lost()
        with self.lock:
            gone = [f for f in self.inflight.values() if f.entry_id in lost]
            for f in gone:
                del self.inflight[f.request_id]
        for f in gone:
            self.engine.abort(f.request_id)
            self.metrics.forget(f.request_id, f.req.sampling.n)
            log.warning("request %s was taken over by another worker", f.request_id)
        self.outbox.drop({f.request_id for f in gone})

    def _routed_inflight(self, written: Written) -> dict[str, int]:
        # The entries this trip acknowledges (ends, hand-backs, drops) leave the pending list
        # with it: the stats written in the same trip must not count them.
        ended = {f.entry_id for f, _ in written.finished}
        ended.update(f.entry_id for f in self.outbox.requeues[: written.num_requeues])
        ended.update(entry_id for _, entry_id in self.outbox.acks[: written.num_acks])
        return self.intake.routed_inflight(owned_entries(self.inflight, self.lock), ended)

    def _stats_mapping(self, stats: Any) -> dict[str, Any]:
        return {
            "step": self.counts.num_steps,
            "last_cancel_step": self.counts.last_cancel_step,
            "num_running": stats.num_running,
            "num_waiting": stats.num_waiting,
            "num_free_blocks": stats.num_free_blocks,
            "num_total_blocks": stats.num_total_blocks,
            "kv_cache_usage": f"{stats.kv_cache_usage:.6f}",
            "prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits,
            "num_preemptions": stats.num_preemptions,
            "num_inflight": len(self.inflight),
            "num_waiting_tokens": stats.num_waiting_tokens,
            "published_blocks": self.prefix.num_published,
            **{f"taken_{how}": n for how, n in self.counts.taken.items()},
            "draining": int(self.draining.is_set()),
            "model": self.settings.model_name,
            "updated_at": f"{time.time():.3f}",
            **self.load.fields(),
            **(self.budget.fields() if self.budget is not None else {}),
        }
