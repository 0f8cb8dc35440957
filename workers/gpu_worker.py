# One GPU worker process: pulls requests from the Redis priority queues into the engine and runs
# the step loop. Each step makes ONE pipelined Redis round trip that publishes every request's
# delta, finishes requests (usage record, XACK), picks up cancellations, writes engine stats and
# reads new work (interactive always, batch only with headroom). The round trip for step N runs
# while step N+1 is on the GPU (between the engine's begin_step and finish_step, on this one
# thread), so it costs the GPU nothing; what it read applies before step N+2. A heartbeat thread
# keeps the worker's alive key and the idle time of its pending queue entries fresh, so
# XAUTOCLAIM by other workers takes only the entries of a worker that stopped heartbeating.
#
# Redis away: a round trip that fails leaves everything it carried to the next one (what it
# publishes is idempotent for readers, its finishes are fenced: service/queue_ownership.py) and the
# worker stops stepping — the engine keeps its state, nothing is generated that nobody can
# receive — and retries with back-off. When Redis answers again it publishes what waited and
# carries on; after `redis_outage_s` it ends its requests explicitly (billing what it had
# published) and keeps waiting for Redis to deliver those ends. It never exits on a Redis error.
#
# The class is assembled from its parts: the loop and its lifecycle here, the round trip in
# workers/round_trip.py, taking requests in in workers/queue_admission.py, ending them other
# than by finishing (outage, drain, shutdown) in workers/request_ends.py, stopping those whose
# API process died in workers/client_leases.py.
from __future__ import annotations

import contextlib
import gc
import logging
import os
import secrets
import socket
import threading
import time

import redis

from engine import LLMEngine
from service import streams as p
from service.redis_clients import UNREACHABLE, Backoff, sync_redis
from service.settings import Settings
from workers.client_leases import ClientLeaseWatch
from workers.control import WorkerControl
from workers.heartbeat import Heartbeat
from workers.inflight import Inflight
from workers.intake_budget import IntakeBudget
from workers.load_report import LoadReport
from workers.metrics import WorkerMetrics
from workers.metrics_publisher import MetricsPublisher
from workers.outbox import Outbox
from workers.poll_pacer import SPIN_S, PollPacer
from workers.prefix_publisher import PrefixPublisher
from workers.queue_admission import QueueAdmission
from workers.request_ends import RequestEnds
from workers.round_trip import Exchange, RoundTrip
from workers.step_prices import StepPrices
from workers.step_timing import StepTiming
from workers.torch_threads import apply_torch_threads
from workers.usage import BusyMeter
from workers.work_intake import HOW, Intake

log = logging.getLogger("fleetlm.worker")


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def build_engine(settings: Settings) -> LLMEngine:
    threads = apply_torch_threads(settings.device, settings.torch_threads)
    log.info("torch uses %d intra-op thread(s) (FLEETLM_TORCH_THREADS overrides)", threads)
    return LLMEngine(settings.engine_config())


class GpuWorker(RoundTrip, QueueAdmission, RequestEnds, ClientLeaseWatch):
    def __init__(self, settings: Settings, redis_url: str, worker_id: str | None = None) -> None:
        self.settings = settings
        self.worker_id = worker_id or new_worker_id()
        # An idle worker's XREADGROUP blocks half a heartbeat interval.
        self.redis = sync_redis(redis_url, settings, block_s=settings.heartbeat_interval_s)
        self.engine = build_engine(settings)
        self.inflight: dict[str, Inflight] = {}
        self._lock = threading.Lock()  # guards `inflight` against the heartbeat thread
        self.outbox = Outbox(self.worker_id, settings)  # what waits for a round trip
        self.stopping = threading.Event()
        # Drain (SIGTERM): read no new work, hand back the unstarted, let the rest finish until
        # drain_timeout_s, then end what still runs (`shutdown` error, billed as published).
        self.draining = threading.Event()
        self._drain_deadline: float | None = None
        self.outage_since: float | None = None  # Redis unreachable since (monotonic)
        self._outage_ended = False  # requests were ended for this outage
        self._backoff = Backoff()
        self._reclaim_after = 0.0  # monotonic: no XAUTOCLAIM before (others' heartbeats resume)
        self.num_steps = 0
        self.last_cancel_step = -1  # the step after which the last cancel freed its KV blocks
        self._last_reclaim = 0.0
        self._claim_cursor: dict[str, str] = {}  # queue → XAUTOCLAIM scan position
        self._dead_after_ms = int(settings.worker_dead_after_s * 1000)
        self.intake = Intake(self.worker_id)  # its queues, and the other routed workers'
        self._took_nothing = False  # the last take found nothing: an idle worker may block
        self.taken = dict.fromkeys(HOW, 0)  # requests by how this worker came by them
        self.prefix = PrefixPublisher(
            self.engine.block_manager, self.worker_id, settings, self._dead_after_ms
        )
        self.heartbeat = Heartbeat(
            sync_redis(redis_url, settings),
            self.worker_id,
            settings.model_name,
            self._dead_after_ms,
            self._owned,
        )
        self.busy = BusyMeter(self.worker_id, settings.busy_interval_s)
        self.load = LoadReport()
        self.prices = StepPrices()  # what a turn costs, fit on this worker's own turns
        self.budget: IntakeBudget | None = None  # the last turn's (workers/intake_budget.py)
        self.pacer = PollPacer()
        self.metrics = WorkerMetrics(settings.model_name, settings.metrics_snapshot_s)
        self.metrics_publisher = MetricsPublisher(
            sync_redis(redis_url, settings), self.metrics.registry,
            p.metrics_key(self.worker_id), self._dead_after_ms,
        )  # fmt: skip
        self.step_timing = StepTiming(self.engine, self.worker_id, settings.worker_step_trace_dir)
        self.control = WorkerControl(self.engine, settings, redis_url, self.worker_id)

    # -- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        # The model, the engine and the tokenizer are built and stay: keep the collector from
        # re-scanning them in every full collection on the step path.
        gc.collect()
        gc.freeze()
        self._until_redis_answers(self._create_groups)
        threading.Thread(
            target=self.heartbeat.run,
            args=(self.stopping, self.settings.heartbeat_interval_s),
            name="heartbeat",
            daemon=True,
        ).start()
        self.metrics_publisher.start()
        self.control.start(self.stopping)
        if self.settings.worker_metrics_port:
            self.metrics.serve(self.settings.worker_metrics_port)
        log.info("worker %s ready (model %s)", self.worker_id, self.settings.model)
        try:
            while not self.stopping.is_set():
                self.control.run_pending()  # /reset_prefix_cache, /start_profile, ...
                if self.draining.is_set() and self._drained():
                    break
                self._turn()
        finally:
            self.control.close()
            self.step_timing.flush(force=True)
            self.step_timing.close()
            self._shutdown()

    def _create_groups(self) -> None:
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

    def _took(self, how: str) -> None:
        self.taken[how] += 1
        self.metrics.taken.labels(self.settings.model_name, how).inc()

    def _until_redis_answers(self, call) -> None:
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                return call()
            except UNREACHABLE as exc:
                log.warning("redis unreachable (%s); retrying", exc.__class__.__name__)
                self.stopping.wait(backoff.next_s())

    def _turn(self) -> None:
        """One loop turn: launch a step, do the Redis round trip for the previous one while
        the GPU works (reading new work again every worker_poll_s until the step is done),
        finish the step, then apply what was read."""
        if self.outage_since is not None:
            self._ride_out_outage()
            return
        loop_started = time.perf_counter()
        step = self.engine.schedule_step() if self.engine.has_unfinished() else None
        if not self.settings.worker_overlap_exchange:
            deltas = self.engine.finish_step(self.engine.launch_step(step)) if step else []
            row = self._account(step, deltas, loop_started)
            reply = self._round_trip(busy=False)
            if reply is not None:
                self._apply(*reply, row)
            self.step_timing.end_loop(row, loop_started)
            return
        # A graph replay launches in well under a millisecond, so its round trip follows the
        # launch; a step launched kernel by kernel (prefill chunks) keeps the host busy for
        # tens of milliseconds, so the previous step's tokens go out before it.
        if step is not None and step.graphed:
            self._launch(step)
        reply = self._round_trip(busy=step is not None)
        polled: list = []
        row = -1
        if step is not None:
            if not step.graphed:
                self._launch(step)
            seen_done = False
            if reply is not None:
                polled, seen_done = self._poll_while_running(step, *reply)
            deltas = self.engine.finish_step(step)
            if not seen_done:
                self.pacer.done()
            row = self._account(step, deltas, loop_started)
        if reply is not None:
            self._apply(*reply, row, polled)
        self.step_timing.end_loop(row, loop_started)

    def _launch(self, step) -> None:
        self.engine.launch_step(step)
        out = step.out  # the pacer times the step from its launch
        self.pacer.launched(decode_only=out.num_decodes == len(out.requests))

    def _account(self, step, deltas: list, loop_started: float) -> int:
        """A finished step's deltas go to the outbox; its busy time, metrics and service rate
        are counted. Returns its trace row (-1: no step). The rate counts the whole turn so
        far: what a step costs the loop, host work and the round trip included
        (workers/load_report.py)."""
        self.outbox.deltas += deltas
        if step is None:
            return -1
        self._emulate_cost(step)
        elapsed = self.engine.step_time(step)
        self.busy.add(elapsed)
        self.num_steps += 1
        self.metrics.on_step([d for d in deltas if d.request_id in self.inflight], elapsed)
        turn_s = time.perf_counter() - loop_started
        self.load.on_step(step.out.total_tokens, turn_s)
        self.prices.observe(step.out.features, turn_s)
        return self.engine.last_step_row

    def _emulate_cost(self, step) -> None:
        """Settings.emulate_step_cost_s: the step takes as long as a bigger model's would."""
        cost, shape = self.settings.emulate_step_cost_s, step.out.features
        if cost is not None and shape is not None:
            fixed, per_row, per_token = cost
            time.sleep(fixed + per_row * shape.decodes + per_token * shape.prefill_tokens)

    def _poll_while_running(self, step, exchange: Exchange, results: list) -> tuple[list, bool]:
        """New queue entries read while the step is still on the GPU, every worker_poll_s, as
        long as the step is expected to outlast a poll (workers/poll_pacer.py): a request that
        arrives during a long step is admitted right after it, not a step later. Returns
        [(queue, entry_id, fields)] for _apply, and whether the step was seen done."""
        interval = self.settings.worker_poll_s
        room = exchange.room - exchange.num_read(results)
        entries: list = []
        if interval <= 0 or room <= 0:
            return entries, False
        next_poll = time.perf_counter() + interval
        streams = dict.fromkeys(exchange.read_streams, ">")
        while room > 0:
            if self.engine.step_done(step):
                self.pacer.done()
                return entries, True
            now = time.perf_counter()
            if now < next_poll:
                time.sleep(SPIN_S)
                continue
            if not self.pacer.may_poll():
                break  # finish_step waits on the step's event, and returns the moment it ends
            try:
                got = self.redis.xreadgroup(p.GROUP, self.worker_id, streams, count=room)
            except UNREACHABLE:
                break  # the next round trip finds Redis away
            except redis.ResponseError:
                break  # NOGROUP: the next round trip recreates the groups
            self.pacer.polled(time.perf_counter() - now)
            for queue, read in got or []:
                entries.extend((queue, entry_id, fields) for entry_id, fields in read)
                room -= len(read)
            next_poll = time.perf_counter() + interval
        return entries, False

    def _owned(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(f.queue, f.entry_id) for f in self.inflight.values()]
