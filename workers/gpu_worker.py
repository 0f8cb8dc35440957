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
# publishes is idempotent for readers, its finishes are fenced: workers/ownership.py) and the
# worker stops stepping — the engine keeps its state, nothing is generated that nobody can
# receive — and retries with back-off. When Redis answers again it publishes what waited and
# carries on; after `redis_outage_s` it ends its requests explicitly (billing what it had
# published) and keeps waiting for Redis to deliver those ends. It never exits on a Redis error.
from __future__ import annotations

import gc
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from engine import LLMEngine, SamplingParams
from service import streams as p
from service.events import (
    ErrorEvent,
    decode_event,
    error_event,
)
from service.output_stream import follow
from service.queued_request import QueuedRequest
from service.redis_clients import UNREACHABLE, Backoff, sync_redis
from service.settings import Settings
from workers.control import WorkerControl
from workers.heartbeat import Heartbeat
from workers.inflight import Inflight
from workers.load_report import LoadReport
from workers.metrics import WorkerMetrics
from workers.outbox import Outbox, Written
from workers.output_events import cancelled_before_takeover
from workers.ownership import takeover_call
from workers.step_timing import StepTiming
from workers.torch_threads import apply_torch_threads
from workers.usage import BusyMeter

log = logging.getLogger("fleetlm.worker")

SHUTDOWN_ATTEMPTS_S = 10.0  # the last round trip is retried this long while Redis is away


@dataclass(slots=True)
class Exchange:
    """One step's Redis round trip, and where its replies land in the results."""

    pipe: redis.client.Pipeline
    written: Written  # what it carries out of the outbox
    ids: list[str] = field(default_factory=list)  # inflight ids whose cancel keys were read
    streams: list[str] = field(default_factory=list)  # queues XAUTOCLAIMed, in order
    at_cancels: int = -1
    at_reclaim: int = -1
    at_read: int = -1  # the XREADGROUP's reply, or -1 when nothing was read
    idle: bool = False  # nothing to step: the read may block
    build_s: float = 0.0
    io_s: float = 0.0
    read_streams: list[str] = field(default_factory=list)  # the queues work may be read from
    room: int = 0  # how many new requests the engine may take this turn


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


def build_engine(settings: Settings) -> LLMEngine:
    threads = apply_torch_threads(settings.device, settings.torch_threads)
    log.info("torch uses %d intra-op thread(s) (FLEETLM_TORCH_THREADS overrides)", threads)
    return LLMEngine(settings.engine_config())


class GpuWorker:
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
        self.heartbeat = Heartbeat(
            sync_redis(redis_url, settings),
            self.worker_id,
            settings.model_name,
            self._dead_after_ms,
            self._owned,
        )
        self.busy = BusyMeter(self.worker_id, settings.busy_interval_s)
        self.load = LoadReport()
        self.metrics = WorkerMetrics(settings.model_name, settings.metrics_snapshot_s)
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
        for priority in p.PRIORITIES:
            try:
                self.redis.xgroup_create(p.queue_key(priority), p.GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        # Stats before the first heartbeat: a worker seen alive always has them.
        stats_key = p.stats_key(self.worker_id)
        self.redis.hset(stats_key, mapping=self._stats_mapping(self.engine.stats()))
        self.redis.expire(stats_key, 60)
        self.heartbeat.beat()

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
            self.engine.launch_step(step)
        reply = self._round_trip(busy=step is not None)
        polled: list = []
        row = -1
        if step is not None:
            if not step.graphed:
                self.engine.launch_step(step)
            if reply is not None:
                polled = self._poll_while_running(step, *reply)
            row = self._account(step, self.engine.finish_step(step), loop_started)
        if reply is not None:
            self._apply(*reply, row, polled)
        self.step_timing.end_loop(row, loop_started)

    def _account(self, step, deltas: list, loop_started: float) -> int:
        """A finished step's deltas go to the outbox; its busy time, metrics and service rate
        are counted. Returns its trace row (-1: no step). The rate counts the whole turn so
        far: what a step costs the loop, host work and the round trip included
        (workers/load_report.py)."""
        self.outbox.deltas += deltas
        if step is None:
            return -1
        elapsed = self.engine.step_time(step)
        self.busy.add(elapsed)
        self.num_steps += 1
        self.metrics.on_step([d for d in deltas if d.request_id in self.inflight], elapsed)
        self.load.on_step(step.out.total_tokens, time.perf_counter() - loop_started)
        return self.engine.last_step_row

    def _poll_while_running(self, step, exchange: Exchange, results: list) -> list:
        """New queue entries read while the step is still on the GPU, every worker_poll_s:
        a request that arrives during a long step is admitted right after it, not a step
        later. Returns [(queue, entry_id, fields)] for _apply."""
        interval = self.settings.worker_poll_s
        room = exchange.room - sum(
            len(entries) for _, entries in (results[exchange.at_read] or [])
        ) if exchange.at_read >= 0 else 0  # fmt: skip
        entries: list = []
        if interval <= 0 or room <= 0:
            return entries
        next_poll = time.perf_counter() + interval
        streams = dict.fromkeys(exchange.read_streams, ">")
        while room > 0 and not self.engine.step_done(step):
            if time.perf_counter() < next_poll:
                time.sleep(0.0002)
                continue
            try:
                got = self.redis.xreadgroup(p.GROUP, self.worker_id, streams, count=room)
            except UNREACHABLE:
                return entries  # the next round trip finds Redis away
            for queue, read in got or []:
                entries.extend((queue, entry_id, fields) for entry_id, fields in read)
                room -= len(read)
            next_poll = time.perf_counter() + interval
        return entries

    def _ride_out_outage(self) -> None:
        """Redis is away: no step (nobody could receive its tokens), retry the round trip."""
        assert self.outage_since is not None
        if not self._outage_ended and (
            time.monotonic() - self.outage_since > self.settings.redis_outage_s
        ):
            self._end_all(
                error_event(
                    f"Redis was unreachable for more than {self.settings.redis_outage_s:.0f}s",
                    "redis_unavailable",
                ),
                through=lambda f: f.confirmed_tokens,
                drop_waiting=True,
            )
            self._outage_ended = True
        self.stopping.wait(self._backoff.next_s())
        reply = self._round_trip(busy=False)
        if reply is not None:
            self._apply(*reply, -1)

    def _end_all(self, event: ErrorEvent, *, through, drop_waiting: bool) -> None:
        """Ends every request this worker runs with `event`, billed `through(request)` output
        tokens. `drop_waiting`: their deltas not yet published are dropped (Redis was away: the
        client's stream already ended where it stopped), else published before the end."""
        ended = set()
        ending = self.outbox.failing()
        if not drop_waiting:  # an end the engine produced, waiting to be published, stands
            ending |= self.outbox.finishing()
        with self._lock:
            inflight = list(self.inflight.values())
        for f in inflight:
            if f.final is not None or f.request_id in ending:
                continue
            self._abort(f.request_id)
            f.final = error_event(event["message"], event["code"])
            f.final["usage"] = f.usage(through(f))
            ended.add(f.request_id)
        if drop_waiting:
            self.outbox.drop(ended)
        self.outbox.failed += [(f, f.final) for f in inflight if f.request_id in ended]
        if ended:
            log.warning("ended %d requests: %s", len(ended), event["message"])

    def _owned(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(f.queue, f.entry_id) for f in self.inflight.values()]

    def _drained(self) -> bool:
        """Drain bookkeeping at the top of each loop turn; True once nothing is left to run."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.settings.drain_timeout_s
            unstarted = self._hand_back_unstarted()
            log.info("draining: handed back %d, finishing %d", unstarted, len(self.inflight))
        if not self.inflight and not self.outbox.failed and not self.outbox.requeues:
            return True
        if time.monotonic() > self._drain_deadline:
            log.warning("drain deadline passed with %d requests running", len(self.inflight))
            return True
        return False

    def _shutdown(self) -> None:
        """Publishes what waits, ends the requests still streaming (`shutdown`, billed as
        published), hands unstarted ones back to their queue, and leaves the worker set."""
        self._hand_back_unstarted()
        self._end_all(
            error_event("The server is shutting down; the request was stopped.", "shutdown"),
            through=self.outbox.tokens_through,
            drop_waiting=False,
        )
        self.outbox.busy_record = self.outbox.busy_record or self.busy.flush()
        deadline = time.monotonic() + min(SHUTDOWN_ATTEMPTS_S, self.settings.redis_outage_s)
        backoff = Backoff()
        while True:
            try:
                exchange = self._build(busy=False, final=True)
                exchange.pipe.delete(
                    p.alive_key(self.worker_id),
                    p.stats_key(self.worker_id),
                    p.metrics_key(self.worker_id),
                )
                exchange.pipe.srem(p.WORKERS_SET, self.worker_id)
                exchange.pipe.execute()
                self._confirm(exchange)
                return
            except UNREACHABLE as exc:
                if time.monotonic() > deadline:
                    log.warning("could not hand back work on shutdown: %s", exc)
                    return
                time.sleep(backoff.next_s())

    def _hand_back_unstarted(self) -> int:
        """Requests that have not streamed yet go back to their queue, for any worker."""
        failing = self.outbox.failing()
        with self._lock:
            unstarted = [
                f
                for f in self.inflight.values()
                if not f.published and f.final is None and f.request_id not in failing
            ]
            for f in unstarted:
                del self.inflight[f.request_id]
        for f in unstarted:
            self._abort(f.request_id)
            self.metrics.forget(f.request_id)
        self.outbox.requeues += unstarted
        return len(unstarted)

    def _abort(self, request_id: str) -> bool:
        try:
            return self.engine.abort(request_id)
        except RuntimeError:  # an error escaped mid-step (shutting down): nothing to free
            return False

    # -- the per-step round trip ----------------------------------------------------------

    def _round_trip(self, *, busy: bool) -> tuple[Exchange, list] | None:
        """Publish what waits, read cancels and new work: one pipelined round trip. `busy`: a
        step is running, so the read must not block. None when Redis did not answer."""
        t0 = time.perf_counter()
        exchange = self._build(busy=busy)
        t1 = time.perf_counter()
        try:
            results = exchange.pipe.execute()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # A Redis that came back without the queues' consumer group (a replica promoted
            # from an empty one, say): recreate it; what this trip carried is sent again.
            log.warning("the queues' consumer group is gone; recreating it")
            self._until_redis_answers(self._create_groups)
            return None
        except UNREACHABLE as exc:
            if self.outage_since is None:
                self.outage_since = time.monotonic()
                log.warning("redis unreachable (%s): pausing the engine", exc.__class__.__name__)
            return None
        exchange.build_s, exchange.io_s = t1 - t0, time.perf_counter() - t1
        if self.outage_since is not None:
            log.info("redis is back after %.1fs", time.monotonic() - self.outage_since)
            self.outage_since, self._outage_ended = None, False
            self._backoff.reset()
            # Every heartbeat lapsed meanwhile: give the other workers time to renew theirs
            # before taking their entries for dead ones.
            self._reclaim_after = time.monotonic() + self.settings.worker_dead_after_s
        self._confirm(exchange)
        if exchange.at_read < 0 and exchange.idle:
            time.sleep(0.01)  # nothing to step and nothing read: do not spin
        return exchange, results

    def _build(self, *, busy: bool, final: bool = False) -> Exchange:
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
        stats = self.engine.stats()
        pipe.hset(p.stats_key(self.worker_id), mapping=self._stats_mapping(stats))
        pipe.expire(p.stats_key(self.worker_id), 60)
        snapshot = self.metrics.snapshot_due(stats, self.draining.is_set())
        if snapshot is not None:
            pipe.set(p.metrics_key(self.worker_id), snapshot, px=self._dead_after_ms)

        room = self.settings.worker_max_waiting - stats.num_waiting
        if self.draining.is_set() or self.outage_since is not None:
            room = 0
        streams = [p.queue_key("interactive")]
        free_frac = stats.num_free_blocks / max(stats.num_total_blocks, 1)
        if (
            free_frac >= self.settings.batch_min_free_kv
            and stats.num_waiting <= self.settings.batch_max_waiting
        ):
            streams.append(p.queue_key("batch"))
        exchange.at_reclaim = len(pipe)
        now = time.monotonic()
        reclaim = (
            not self.draining.is_set()
            and self.outage_since is None
            and now >= self._reclaim_after
            and now - self._last_reclaim > self.settings.heartbeat_interval_s
        )
        if reclaim:
            # Even when full: a stream whose worker died is waited on by its client.
            self._last_reclaim = now
            exchange.streams = streams
            for queue in streams:
                start = self._claim_cursor.get(queue, "0-0")
                pipe.xautoclaim(
                    queue, p.GROUP, self.worker_id, self._dead_after_ms, start, count=max(room, 2)
                )
        exchange.idle = idle = not busy and not self.engine.has_unfinished()
        if room > 0:
            # Idle: block on the queues (bounded, so stop requests are seen); busy: just poll.
            block = int(self.settings.heartbeat_interval_s * 500) if idle else None
            exchange.at_read = len(pipe)
            pipe.xreadgroup(
                p.GROUP, self.worker_id, dict.fromkeys(streams, ">"), count=room, block=block
            )
        exchange.read_streams, exchange.room = streams, max(room, 0)
        return exchange

    def _confirm(self, exchange: Exchange) -> None:
        """Redis took the round trip: what it carried leaves the outbox."""
        self.outbox.confirm(exchange.written)
        for f, record in exchange.written.finished:
            with self._lock:
                self.inflight.pop(f.request_id, None)
            self.metrics.forget(f.request_id)
            completion = record.counts["completion_tokens"]
            if record.status in ("completed", "length"):
                self.load.on_finished(completion)
            log.info(
                "request finished",
                extra={
                    "request_id": f.request_id,
                    "tenant_id": f.req.tenant_id,
                    "status": record.status,
                    "completion_tokens": completion,
                },
            )

    def _apply(self, exchange: Exchange, results: list, row: int, polled: list = ()) -> None:
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
                    self.last_cancel_step = self.num_steps
                    log.info("cancelled %s", request_id)
        if exchange.streams:
            claims = results[exchange.at_reclaim : exchange.at_reclaim + len(exchange.streams)]
            for queue, claimed in zip(exchange.streams, claims):
                self._claim_cursor[queue] = claimed[0]
                self._admit_reclaimed(queue, claimed[1])
        if exchange.at_read >= 0:
            for queue, entries in results[exchange.at_read] or []:
                for entry_id, fields in entries:
                    self._admit(queue, entry_id, fields, counted=True)
        for queue, entry_id, fields in polled:
            self._admit(queue, entry_id, fields, counted=True)
        self.step_timing.add(
            row, exchange_build_s=exchange.build_s, exchange_io_s=exchange.io_s,
            apply_s=time.perf_counter() - t0,
        )  # fmt: skip

    def _drop_lost(self) -> None:
        """Requests another worker claimed while this one was cut off: it runs them now (and
        bills them); stop them here without a word."""
        lost = self.heartbeat.take_lost()
        with self._lock:
            gone = [f for f in self.inflight.values() if f.entry_id in lost]
            for f in gone:
                del self.inflight[f.request_id]
        for f in gone:
            self.engine.abort(f.request_id)
            self.metrics.forget(f.request_id)
            log.warning("request %s was taken over by another worker", f.request_id)
        self.outbox.drop({f.request_id for f in gone})

    def _stats_mapping(self, stats: Any) -> dict[str, Any]:
        return {
            "step": self.num_steps,
            "last_cancel_step": self.last_cancel_step,
            "num_running": stats.num_running,
            "num_waiting": stats.num_waiting,
            "num_free_blocks": stats.num_free_blocks,
            "num_total_blocks": stats.num_total_blocks,
            "kv_cache_usage": f"{stats.kv_cache_usage:.6f}",
            "prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits,
            "num_preemptions": stats.num_preemptions,
            "num_inflight": len(self.inflight),
            "draining": int(self.draining.is_set()),
            "model": self.settings.model_name,
            "updated_at": f"{time.time():.3f}",
            **self.load.fields(),
        }

    # -- admission -----------------------------------------------------------------------

    def _admit(
        self,
        queue: str,
        entry_id: str,
        fields: dict | None,
        *,
        counted: bool = False,
        resume: Any = None,
    ) -> None:
        """`counted`: read off the queue (not reclaimed), so its queued tokens leave the queue's
        counter; `resume`: the follower of the stream another worker started."""
        if not fields or "r" not in fields:  # deleted while pending
            self.outbox.acks.append((queue, entry_id))
            return
        req = QueuedRequest.decode(fields["r"])
        if req.request_id in self.inflight:
            return
        if counted and req.queued_tokens:
            self.outbox.add_dequeued(req.priority, req.queued_tokens)
        f = Inflight(req, queue, entry_id)
        output: list[int] = []
        if resume is not None:
            output = resume.token_ids
            f.published = True
            f.sent_tokens = f.confirmed_tokens = resume.num_tokens
            f.cached_tokens = resume.cached_tokens
        with self._lock:
            self.inflight[req.request_id] = f
        try:
            self.engine.add_request(
                req.request_id,
                req.prompt_token_ids,
                SamplingParams(**asdict(req.sampling)),
                priority=req.priority,
                arrival_time=req.enqueued_at,
                cache_salt=req.tenant_id,  # prefix-cache hits never cross tenants
                output_token_ids=output,
            )
        except (ValueError, TypeError) as exc:
            code = "worker_lost" if resume is not None else "invalid_request"
            event = error_event(str(exc), code)
            event["usage"] = f.usage(f.sent_tokens)
            self.outbox.failed.append((f, event))

    def _admit_reclaimed(self, queue: str, claimed: list) -> None:
        """Entries of a worker taken for dead. One that is still ours (this worker was cut off
        from Redis and its own heartbeat lapsed) stays as it is; any other is taken over:
        re-run from the start, resumed after the tokens its stream already delivered, or ended
        if its client went away meanwhile."""
        for entry_id, fields in claimed:
            if not fields or "r" not in fields:
                self.outbox.acks.append((queue, entry_id))
                continue
            req = QueuedRequest.decode(fields["r"])
            if req.request_id in self.inflight:
                continue
            ttl = self.outbox.output_ttl(Inflight(req, queue, entry_id))
            try:
                raw, cancel = self.redis.eval(*takeover_call(req.request_id, self.worker_id, ttl))
            except UNREACHABLE as exc:  # still pending on us: claimed again later
                log.warning("could not take over %s: %s", req.request_id, exc)
                continue
            # A script's reply: each entry is [id, [field, value, ...]].
            follower, _ = follow([decode_event(dict(zip(f[::2], f[1::2]))) for _, f in raw])
            if follower.finished:  # ended, and its entry left behind
                self.outbox.acks.append((queue, entry_id))
            elif cancel is not None:
                f = Inflight(req, queue, entry_id, published=True)
                f.cached_tokens = follower.cached_tokens
                with self._lock:
                    self.inflight[req.request_id] = f
                self.outbox.failed.append((f, cancelled_before_takeover(f, follower, cancel)))
            else:
                resume = follower if follower.num_tokens else None
                log.info(
                    "taking over %s from a stopped worker after %d tokens",
                    req.request_id,
                    follower.num_tokens,
                )
                self._admit(queue, entry_id, fields, resume=resume)
