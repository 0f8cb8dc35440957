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
# The worker is composed of the objects it owns, each handed what it reads and writes: the loop
# and its lifecycle here, the round trip in workers/gpu/round_trip.py (which holds the outage
# state), taking requests in in workers/gpu/queue_admission.py, ending them other than by
# finishing (outage, drain, shutdown) in workers/gpu/request_ends.py, stopping those whose API
# process died in workers/gpu/client_leases.py. The requests it runs (`inflight`, guarded by
# `lock` against the heartbeat thread) are shared by all of them.
from __future__ import annotations

import gc
import logging
import os
import secrets
import socket
import threading
import time
from functools import partial

import redis

from engine import LLMEngine
from service import streams as p
from service.redis_clients import UNREACHABLE, sync_redis
from service.settings import Settings
from workers.gpu.client_leases import ClientLeaseWatch
from workers.gpu.control import WorkerControl
from workers.gpu.exchange import Exchange
from workers.gpu.heartbeat import Heartbeat
from workers.gpu.inflight import Inflight, owned_entries
from workers.gpu.load_report import LoadReport
from workers.gpu.metrics import WorkerMetrics
from workers.gpu.metrics_publisher import MetricsPublisher
from workers.gpu.outbox import Outbox
from workers.gpu.poll_pacer import SPIN_S, PollPacer
from workers.gpu.queue_admission import QueueAdmission
from workers.gpu.request_ends import RequestEnds
from workers.gpu.round_trip import RoundTrip, until_redis_answers
from workers.gpu.step_prices import StepPrices
from workers.gpu.step_timing import StepTiming
from workers.gpu.torch_threads import apply_torch_threads
from workers.gpu.usage import BusyMeter
from workers.gpu.worker_counts import WorkerCounts

log = logging.getLogger("fleetlm.worker")
# A step of decodes and up to this many prompt tokens takes its round trip on the exchange
# thread (FLEETLM_WORKER_EXCHANGE_THREAD): it lasts about a decode step, too short for polls
# while it runs to pay (workers/gpu/poll_pacer.py). At the 8B's 28 req/s on the H200 the median
# step carried 15 prompt tokens beside 218 decodes.
BACKGROUND_MAX_PROMPT_TOKENS = 256


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def build_engine(settings: Settings) -> LLMEngine:
    threads = apply_torch_threads(settings.device, settings.torch_threads)
    log.info("torch uses %d intra-op thread(s) (FLEETLM_TORCH_THREADS overrides)", threads)
    engine = LLMEngine(settings.engine_config())
    prepare_grammars(engine)
    return engine


def prepare_grammars(engine: LLMEngine) -> None:
    """The grammar engine's view of the vocabulary, built before the worker takes requests:
    llguidance holds the interpreter lock while it reads it (1-2 s at 128k ids), which at the
    first constrained request would stall every stream of the worker. Skipped, with a line,
    where llguidance is not installed (constrained requests then fail, nothing else does)."""
    try:
        _ = engine.grammars.tokenizer  # built and cached on first access
    except ImportError as exc:
        log.warning("structured outputs unavailable on this worker: %s", exc)


class GpuWorker:
    def __init__(self, settings: Settings, redis_url: str, worker_id: str | None = None) -> None:
        self.settings = settings
        self.worker_id = worker_id = worker_id or new_worker_id()
        # An idle worker's XREADGROUP blocks half a heartbeat interval.
        self.redis = sync_redis(redis_url, settings, block_s=settings.heartbeat_interval_s)
        self.engine = engine = build_engine(settings)
        self.inflight: dict[str, Inflight] = {}
        self.lock = threading.Lock()  # guards `inflight` against the heartbeat thread
        self.outbox = Outbox(worker_id, settings)  # what waits for a round trip
        self.stopping = threading.Event()
        # Drain (SIGTERM): read no new work, hand back the unstarted, let the rest finish until
        # drain_timeout_s, then end what still runs (`shutdown` error, billed as published).
        self.draining = threading.Event()
        self.counts = WorkerCounts()
        dead_after_ms = int(settings.worker_dead_after_s * 1000)
        self.heartbeat = Heartbeat(
            sync_redis(redis_url, settings), worker_id, settings.model_name, dead_after_ms,
            partial(owned_entries, self.inflight, self.lock),
        )  # fmt: skip
        self.busy = BusyMeter(worker_id, settings.busy_interval_s)
        self.load = LoadReport()
        self.prices = StepPrices()  # what a turn costs, fit on this worker's own turns
        # the step-cost model's start-up fit (engine/runner/step_calibration.py), None without
        self.calibration = getattr(engine, "calibration_report", None)
        calibration = self.calibration or {}
        if calibration.get("samples"):
            # the engine's start-up steps, kept in every fit of the turns' prices too: served
            # turns alone leave a document's cost as open as they left the engine's model
            # (engine/runner/step_calibration.py); the prices' level still follows the turns
            self.prices.model.calibrate(calibration["samples"])
        self.pacer = PollPacer()
        self.metrics = WorkerMetrics(settings.model_name, settings.metrics_snapshot_s)
        self.metrics_publisher = MetricsPublisher(
            sync_redis(redis_url, settings), self.metrics.registry,
            p.metrics_key(worker_id), dead_after_ms,
        )  # fmt: skip
        self.step_timing = StepTiming(engine, worker_id, settings.worker_step_trace_dir)
        self.control = WorkerControl(engine, settings, redis_url, worker_id)
        inflight, lock = self.inflight, self.lock
        self.admission = QueueAdmission(
            engine, self.redis, worker_id, inflight, lock, self.outbox, self._took
        )
        self.leases = ClientLeaseWatch(engine, inflight, lock, settings.api_lease_ttl_s)
        self.trip = RoundTrip(
            settings=settings,
            worker_id=worker_id,
            redis_client=self.redis,
            engine=engine,
            inflight=inflight,
            lock=lock,
            outbox=self.outbox,
            counts=self.counts,
            took=self._took,
            admission=self.admission,
            leases=self.leases,
            heartbeat=self.heartbeat,
            busy=self.busy,
            load=self.load,
            prices=self.prices,
            metrics=self.metrics,
            metrics_publisher=self.metrics_publisher,
            step_timing=self.step_timing,
            draining=self.draining,
            stopping=self.stopping,
        )
        self.ends = RequestEnds(
            settings=settings,
            worker_id=worker_id,
            engine=engine,
            inflight=inflight,
            lock=lock,
            outbox=self.outbox,
            trip=self.trip,
            busy=self.busy,
            metrics=self.metrics,
            metrics_publisher=self.metrics_publisher,
            stopping=self.stopping,
        )

    # -- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        # The model, the engine and the tokenizer are built and stay: keep the collector from
        # re-scanning them in every full collection on the step path.
        gc.collect()
        gc.freeze()
        until_redis_answers(self.stopping, self.trip.create_groups)
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
        calibration = self.calibration
        if calibration and "error" in calibration:
            log.warning("step-cost calibration failed, the model fits online only: %s",
                        calibration["error"])  # fmt: skip
        elif calibration:
            log.info("step costs calibrated: %d steps in %.1f s, weights %s",
                     calibration["steps"], calibration["seconds"],
                     " ".join(f"{w:.3g}" for w in calibration["weights"]))  # fmt: skip
        try:
            while not self.stopping.is_set():
                self.control.run_pending()  # /reset_prefix_cache, /start_profile, ...
                if self.draining.is_set() and self.ends.drained():
                    break
                self._turn()
        finally:
            self.control.close()
            self.trip.close()
            self.step_timing.flush(force=True)
            self.step_timing.close()
            self.ends.shutdown()

    def _took(self, how: str) -> None:
        self.counts.taken[how] += 1
        self.metrics.taken.labels(self.settings.model_name, how).inc()

    def _turn(self) -> None:
        """One loop turn: launch a step, do the Redis round trip for the previous one while
        the GPU works (reading new work again every worker_poll_s until the step is done),
        finish the step, then apply what was read."""
        if self.trip.outage.active:
            self.ends.ride_out_outage()
            return
        loop_started = time.perf_counter()
        step = self.engine.schedule_step() if self.engine.has_unfinished() else None
        if not self.settings.worker_overlap_exchange:
            deltas = self.engine.finish_step(self.engine.launch_step(step)) if step else []
            row = self._account(step, deltas, loop_started)
            reply = self.trip.run(busy=False)
            if reply is not None:
                self.trip.apply(*reply, row)
            self.step_timing.end_loop(row, loop_started)
            return
        # A graph replay launches in well under a millisecond, so its round trip follows the
        # launch; a step launched kernel by kernel (prefill chunks) keeps the host busy for
        # tens of milliseconds, so the previous step's tokens go out before it.
        out = step.out if step is not None else None
        if (
            out is not None
            and out.total_tokens - out.num_decodes <= BACKGROUND_MAX_PROMPT_TOKENS
            and self.settings.worker_exchange_thread
        ):
            self._turn_exchanging_in_background(step, loop_started)
            return
        if step is not None and step.graphed:
            self._launch(step)
        reply = self.trip.run(busy=step is not None)
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
            self.trip.apply(*reply, row, polled)
        self.step_timing.end_loop(row, loop_started)

    def _turn_exchanging_in_background(self, step, loop_started: float) -> None:
        """A turn of decodes (and a few prompt tokens) with its round trip on the exchange
        thread: the trip is built here, then Redis is waited for while this thread finishes the
        step (its tokens, detokenized, into the outbox for the next trip), and what the trip
        read is applied after both. On the H200 at ~200 running (the 8B at 28 req/s) a turn was
        32.6 ms of host work for 21.6 ms of GPU, ~10 ms of it the trip's wait: the GPU idled
        ~9 ms a turn.
        A step with more prompt tokens keeps _turn's order: it polls the queues while it runs (a
        request arriving during a long prefill is admitted right after it). A step launched
        kernel by kernel (no graphs: a CPU worker) is launched after the trip is sent, so the
        previous step's tokens go out first and the wait overlaps the launch too."""
        if step.graphed:
            self._launch(step)
        pending = self.trip.start(busy=True, in_background=True)
        if not step.graphed:
            self._launch(step)
        deltas = self.engine.finish_step(step)
        self.pacer.done()
        row = self._account(step, deltas, loop_started, turn_ended=False)
        reply = self.trip.finish(pending)
        self._observe_turn(step, loop_started)
        if reply is not None:
            self.trip.apply(*reply, row)
        self.step_timing.end_loop(row, loop_started)

    def _launch(self, step) -> None:
        self.engine.launch_step(step)
        out = step.out  # the pacer times the step from its launch
        self.pacer.launched(decode_only=out.num_decodes == len(out.requests))

    def _account(self, step, deltas: list, loop_started: float, turn_ended: bool = True) -> int:
        """A finished step's deltas go to the outbox; its busy time, metrics and (when the
        turn has ended: _observe_turn) service rate are counted. Returns its trace row (-1: no
        step)."""
        self.outbox.deltas += deltas
        if step is None:
            return -1
        self._emulate_cost(step)
        elapsed = self.engine.step_time(step)
        self.busy.add(elapsed)
        self.counts.num_steps += 1
        self.metrics.on_step([d for d in deltas if d.request_id in self.inflight], elapsed)
        if turn_ended:
            self._observe_turn(step, loop_started)
        return self.engine.last_step_row

    def _observe_turn(self, step, loop_started: float) -> None:
        """The service rate and the step prices count the whole turn: what a step costs the
        loop, host work and the round trip included (workers/gpu/load_report.py)."""
        turn_s = time.perf_counter() - loop_started
        self.load.on_step(step.out.total_tokens, turn_s)
        self.prices.observe(step.out.features, turn_s)

    def _emulate_cost(self, step) -> None:
        """Settings.emulate_step_cost_s: the step takes as long as a bigger model's would."""
        cost, shape = self.settings.emulate_step_cost_s, step.out.features
        if cost is not None and shape is not None:
            fixed, per_row, per_token = cost
            time.sleep(fixed + per_row * shape.decodes + per_token * shape.prefill_tokens)

    def _poll_while_running(self, step, exchange: Exchange, results: list) -> tuple[list, bool]:
        """New queue entries read while the step is still on the GPU, every worker_poll_s, as
        long as the step is expected to outlast a poll (workers/gpu/poll_pacer.py): a request that
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
