# One GPU worker process: pulls requests from the Redis priority queues into the engine and runs
# the step loop. Each step makes ONE pipelined Redis round trip that publishes every request's
# delta, finishes requests (usage record, XACK), picks up cancellations, writes engine stats and
# reads new work (interactive always, batch only with headroom). The round trip for step N runs
# while step N+1 is on the GPU (between the engine's begin_step and finish_step, on this one
# thread), so it costs the GPU nothing; what it read applies before step N+2. A heartbeat thread
# keeps the worker's alive key and the idle time of its pending queue entries fresh, so
# XAUTOCLAIM by other workers takes only the entries of a worker that stopped heartbeating.
from __future__ import annotations

import gc
import json
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
from metering.ratelimit import release_call
from metering.records import encode_record, usage_counts
from service import streams as p
from service.events import (
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    decode_event,
    encode_event,
    error_event,
)
from service.queued_request import QueuedRequest
from service.settings import Settings
from workers.control import WorkerControl
from workers.metrics import WorkerMetrics
from workers.step_timing import StepTiming
from workers.torch_threads import apply_torch_threads
from workers.usage import BusyMeter, usage_record

log = logging.getLogger("fleetlm.worker")

# A stream's TTL is set with its first event and refreshed every this many (and at its end),
# not with every token: one command per token instead of two on the step's round trip.
TTL_REFRESH_EVENTS = 256


@dataclass(slots=True)
class Inflight:
    req: QueuedRequest
    queue: str
    entry_id: str
    published: bool = False  # any output event sent: from then on it can no longer be re-run
    num_events: int = 0  # delta events published (the stream's TTL is refreshed now and then)


@dataclass(slots=True)
class Exchange:
    """One step's Redis round trip, and where its replies land in the results."""

    pipe: redis.client.Pipeline
    ids: list[str] = field(default_factory=list)  # inflight ids whose cancel keys were read
    streams: list[str] = field(default_factory=list)  # queues XAUTOCLAIMed, in order
    at_cancels: int = -1
    at_reclaim: int = -1
    at_read: int = -1  # the XREADGROUP's reply, or -1 when nothing was read
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
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self._hb_redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.engine = build_engine(settings)
        self.inflight: dict[str, Inflight] = {}
        self._lock = threading.Lock()  # guards `inflight` against the heartbeat thread
        self._failed: list[tuple[Inflight, ErrorEvent]] = []  # (request, final error event)
        self.stopping = threading.Event()
        # Drain (SIGTERM): read no new work, hand back the unstarted, let the rest finish until
        # drain_timeout_s, then stop as usual.
        self.draining = threading.Event()
        self._drain_deadline: float | None = None
        self.num_steps = 0
        self.last_cancel_step = -1  # the step after which the last cancel freed its KV blocks
        self._last_reclaim = 0.0
        self._claim_cursor: dict[str, str] = {}  # queue → XAUTOCLAIM scan position
        self._dead_after_ms = int(settings.worker_dead_after_s * 1000)
        self.busy = BusyMeter(self.worker_id, settings.busy_interval_s)
        self.metrics = WorkerMetrics(settings.model_name, settings.metrics_snapshot_s)
        self.step_timing = StepTiming(self.engine, self.worker_id, settings.worker_step_trace_dir)
        self.control = WorkerControl(self.engine, settings, redis_url, self.worker_id)

    # -- lifecycle -----------------------------------------------------------------------

    def run(self) -> None:
        # The model, the engine and the tokenizer are built and stay: keep the collector from
        # re-scanning them in every full collection on the step path.
        gc.collect()
        gc.freeze()
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
        self._heartbeat()
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        self.control.start(self.stopping)
        if self.settings.worker_metrics_port:
            self.metrics.serve(self.settings.worker_metrics_port)
        log.info("worker %s ready (model %s)", self.worker_id, self.settings.model)
        self._unpublished: list = []  # the last step's deltas, for the next round trip
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
            self._shutdown(self._unpublished)

    def _turn(self) -> None:
        """One loop turn: launch a step, do the Redis round trip for the previous one while
        the GPU works (reading new work again every worker_poll_s until the step is done),
        finish the step, then apply what was read."""
        loop_started = time.perf_counter()
        step = self.engine.schedule_step() if self.engine.has_unfinished() else None
        if not self.settings.worker_overlap_exchange:
            deltas = self.engine.finish_step(self.engine.launch_step(step)) if step else []
            row = self._account(step, deltas)
            exchange, results = self._exchange(deltas, busy=False)
            self._apply(exchange, results, row)
            self.step_timing.end_loop(row, loop_started)
            return
        # A graph replay launches in well under a millisecond, so its round trip follows the
        # launch; a step launched kernel by kernel (prefill chunks) keeps the host busy for
        # tens of milliseconds, so the previous step's tokens go out before it.
        if step is not None and step.graphed:
            self.engine.launch_step(step)
        exchange, results = self._exchange(self._unpublished, busy=step is not None)
        self._unpublished = []
        polled: list = []
        row = -1
        if step is not None:
            if not step.graphed:
                self.engine.launch_step(step)
            polled = self._poll_while_running(step, exchange, results)
            self._unpublished = self.engine.finish_step(step)
            row = self._account(step, self._unpublished)
        self._apply(exchange, results, row, polled)
        self.step_timing.end_loop(row, loop_started)

    def _account(self, step, deltas: list) -> int:
        """Busy time and metrics of a finished step; returns its trace row (-1: no step)."""
        if step is None:
            return -1
        elapsed = self.engine.step_time(step)
        self.busy.add(elapsed)
        self.num_steps += 1
        self.metrics.on_step([d for d in deltas if d.request_id in self.inflight], elapsed)
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
            for queue, got in (
                self.redis.xreadgroup(p.GROUP, self.worker_id, streams, count=room) or []
            ):
                entries.extend((queue, entry_id, fields) for entry_id, fields in got)
                room -= len(got)
            next_poll = time.perf_counter() + interval
        return entries

    def _heartbeat(self) -> None:
        with self._lock:
            owned: dict[str, list[str]] = {}
            for f in self.inflight.values():
                owned.setdefault(f.queue, []).append(f.entry_id)
        pipe = self._hb_redis.pipeline(transaction=False)
        info = json.dumps({"pid": os.getpid(), "model": self.settings.model_name})
        pipe.set(p.alive_key(self.worker_id), info, px=self._dead_after_ms)
        pipe.sadd(p.WORKERS_SET, self.worker_id)
        for queue, ids in owned.items():
            # Resets the idle time of our own pending entries (JUSTID: no delivery count bump).
            pipe.xclaim(queue, p.GROUP, self.worker_id, 0, ids, justid=True)
        pipe.execute()

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.settings.heartbeat_interval_s):
            try:
                self._heartbeat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)

    def _drained(self) -> bool:
        """Drain bookkeeping at the top of each loop turn; True once nothing is left to run."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.settings.drain_timeout_s
            failing = {f.req.request_id for f, _ in self._failed}
            with self._lock:
                unstarted = [
                    f
                    for f in self.inflight.values()
                    if not f.published and f.req.request_id not in failing
                ]
                for f in unstarted:
                    del self.inflight[f.req.request_id]
            pipe = self.redis.pipeline(transaction=False)
            for f in unstarted:
                self.engine.abort(f.req.request_id)
                self._requeue(pipe, f)
            pipe.execute()
            log.info("draining: handed back %d, finishing %d", len(unstarted), len(self.inflight))
        if not self.inflight and not self._failed:
            return True
        if time.monotonic() > self._drain_deadline:
            log.warning("drain deadline passed with %d requests running", len(self.inflight))
            return True
        return False

    def _requeue(self, pipe: redis.client.Pipeline, f: Inflight) -> None:
        """Back to the tail of its queue as a fresh entry, for any worker to take."""
        self.metrics.forget(f.req.request_id)
        pipe.xadd(f.queue, {"r": f.req.encode()})
        pipe.xack(f.queue, p.GROUP, f.entry_id)
        pipe.xdel(f.queue, f.entry_id)

    def _shutdown(self, deltas: list) -> None:
        """Publishes the last step's deltas, hands unstarted requests back to their queue and
        fails the ones already streaming."""
        pipe = self.redis.pipeline(transaction=False)
        for delta in deltas:
            self._publish(pipe, delta)
        with self._lock:
            inflight, self.inflight = list(self.inflight.values()), {}
        for f in inflight:
            self.engine.abort(f.req.request_id)
            if f.published:
                self._finish(pipe, f, self._error_event("worker shutting down", "worker_lost"))
            else:
                self._requeue(pipe, f)
        busy = self.busy.flush()
        if busy is not None:
            pipe.xadd(p.METERING_STREAM, busy)
        pipe.delete(
            p.alive_key(self.worker_id),
            p.stats_key(self.worker_id),
            p.metrics_key(self.worker_id),
        )
        pipe.srem(p.WORKERS_SET, self.worker_id)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not hand back work on shutdown: %s", exc)

    # -- the per-step round trip ----------------------------------------------------------

    def _exchange(self, deltas: list, *, busy: bool) -> tuple[Exchange, list]:
        """Publish `deltas`, read cancels and new work: one pipelined round trip. `busy`: a
        step is running, so the read must not block."""
        t0 = time.perf_counter()
        pipe = self.redis.pipeline(transaction=False)
        for delta in deltas:
            self._publish(pipe, delta)
        for f, event in self._failed:
            self._finish(pipe, f, event)
        self._failed.clear()
        busy = self.busy.due()
        if busy is not None:
            pipe.xadd(p.METERING_STREAM, busy)

        ids = list(self.inflight)
        at_cancels = len(pipe)
        if ids:
            pipe.mget([p.cancel_key(i) for i in ids])
        stats = self.engine.stats()
        pipe.hset(p.stats_key(self.worker_id), mapping=self._stats_mapping(stats))
        pipe.expire(p.stats_key(self.worker_id), 60)
        snapshot = self.metrics.snapshot_due(stats, self.draining.is_set())
        if snapshot is not None:
            pipe.set(p.metrics_key(self.worker_id), snapshot, px=self._dead_after_ms)

        room = self.settings.worker_max_waiting - stats.num_waiting
        if self.draining.is_set():
            room = 0
        streams = [p.queue_key("interactive")]
        free_frac = stats.num_free_blocks / max(stats.num_total_blocks, 1)
        if (
            free_frac >= self.settings.batch_min_free_kv
            and stats.num_waiting <= self.settings.batch_max_waiting
        ):
            streams.append(p.queue_key("batch"))
        at_reclaim = len(pipe)
        reclaim = room > 0 and time.monotonic() - self._last_reclaim > (
            self.settings.heartbeat_interval_s
        )
        if reclaim:
            self._last_reclaim = time.monotonic()
            for queue in streams:
                start = self._claim_cursor.get(queue, "0-0")
                pipe.xautoclaim(
                    queue, p.GROUP, self.worker_id, self._dead_after_ms, start, count=room
                )
        at_read = len(pipe)
        idle = not busy and not self.engine.has_unfinished()
        if room > 0:
            # Idle: block on the queues (bounded, so stop requests are seen); busy: just poll.
            block = int(self.settings.heartbeat_interval_s * 500) if idle else None
            pipe.xreadgroup(
                p.GROUP, self.worker_id, dict.fromkeys(streams, ">"), count=room, block=block
            )
        exchange = Exchange(
            pipe=pipe,
            ids=ids,
            streams=streams if reclaim else [],
            at_cancels=at_cancels,
            at_reclaim=at_reclaim,
            at_read=at_read if room > 0 else -1,
            read_streams=streams,
            room=max(room, 0),
        )
        t1 = time.perf_counter()
        results = pipe.execute()
        exchange.build_s, exchange.io_s = t1 - t0, time.perf_counter() - t1
        if room <= 0 and idle:
            time.sleep(0.01)
        return exchange, results

    def _apply(self, exchange: Exchange, results: list, row: int, polled: list = ()) -> None:
        """What a round trip (and the polls after it) read: cancels first, then new requests."""
        t0 = time.perf_counter()
        if exchange.ids:
            for request_id, flag in zip(exchange.ids, results[exchange.at_cancels]):
                if flag is not None and self.engine.abort(request_id):
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
                    self._admit(queue, entry_id, fields)
        for queue, entry_id, fields in polled:
            self._admit(queue, entry_id, fields)
        self.step_timing.add(
            row, exchange_build_s=exchange.build_s, exchange_io_s=exchange.io_s,
            apply_s=time.perf_counter() - t0,
        )  # fmt: skip

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
        }

    # -- admission -----------------------------------------------------------------------

    def _admit(self, queue: str, entry_id: str, fields: dict | None) -> None:
        if not fields or "r" not in fields:  # deleted while pending
            self.redis.xack(queue, p.GROUP, entry_id)
            return
        req = QueuedRequest.decode(fields["r"])
        if req.request_id in self.inflight:
            return
        f = Inflight(req, queue, entry_id)
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
            )
        except (ValueError, TypeError) as exc:
            self._failed.append((f, self._error_event(str(exc), "invalid_request")))

    def _admit_reclaimed(self, queue: str, claimed: list) -> None:
        """Entries of a dead worker: re-run the unstarted, fail the ones that had streamed."""
        for entry_id, fields in claimed:
            if not fields or "r" not in fields:
                self.redis.xack(queue, p.GROUP, entry_id)
                continue
            req = QueuedRequest.decode(fields["r"])
            last = self.redis.xrevrange(p.output_key(req.request_id), count=1)
            if last:
                f = Inflight(req, queue, entry_id, published=True)
                with self._lock:
                    self.inflight[req.request_id] = f
                event = self._error_event("the worker running this request stopped", "worker_lost")
                n = decode_event(last[0][1]).get("completion_tokens", 0)
                event["usage"] = usage_counts(
                    {"prompt_tokens": len(req.prompt_token_ids), "completion_tokens": n}
                )
                self._failed.append((f, event))
            else:
                log.info("re-running %s from a dead worker", req.request_id)
                self._admit(queue, entry_id, fields)

    # -- output --------------------------------------------------------------------------

    def _publish(self, pipe: redis.client.Pipeline, delta: Any) -> None:
        f = self.inflight.get(delta.request_id)
        if f is None:
            return
        if not delta.finished:
            event: DeltaEvent = {
                "type": "delta",
                "text": delta.new_text,
                "worker": self.worker_id,
                "completion_tokens": delta.usage.completion_tokens,
                "cached_tokens": delta.usage.cached_tokens,
            }
            key = p.output_key(delta.request_id)
            pipe.xadd(key, encode_event(event))
            if f.num_events % TTL_REFRESH_EVENTS == 0:
                pipe.expire(key, self._output_ttl(f.req))
            f.num_events += 1
            f.published = True
            return
        usage = usage_counts(asdict(delta.usage))
        reason = delta.finish_reason
        final: DoneEvent | ErrorEvent
        if reason in ("stop", "length"):
            final = {
                "type": "done",
                "text": delta.new_text,
                "worker": self.worker_id,
                "finish_reason": reason,
                "usage": usage,
            }
        else:
            if reason == "abort":
                final = error_event("request cancelled", "cancelled")
            else:
                final = error_event(delta.error or "the engine failed", "engine_error")
            final |= {"text": delta.new_text, "usage": usage}
        self._finish(pipe, f, final, delta)

    def _output_ttl(self, req: QueuedRequest) -> int:
        # A batch line's output waits for the batch pump (which deletes it), not a live client.
        return self.settings.batch_output_ttl_s if req.batch_id else self.settings.output_ttl_s

    def _error_event(self, message: str, code: str) -> ErrorEvent:
        return error_event(message, code)

    def _finish(
        self,
        pipe: redis.client.Pipeline,
        f: Inflight,
        event: DoneEvent | ErrorEvent,
        delta: Any = None,
    ) -> None:
        """The final event, the usage record and the XACK of one request, in one pipeline."""
        req = f.req
        event["worker"] = self.worker_id
        key = p.output_key(req.request_id)
        pipe.xadd(key, encode_event(event))
        pipe.expire(key, self._output_ttl(req))
        record = usage_record(req, event, delta, self.worker_id)
        pipe.xadd(p.METERING_STREAM, encode_record(record))
        if req.reservation is not None:  # idempotent: releases the slot and refunds once
            used = record.counts["prompt_tokens"] + record.counts["completion_tokens"]
            pipe.eval(
                *release_call(req.tenant_id, req.priority, req.request_id, req.reservation, used)
            )
        pipe.xack(f.queue, p.GROUP, f.entry_id)
        pipe.xdel(f.queue, f.entry_id)
        with self._lock:
            self.inflight.pop(req.request_id, None)
        log.info(
            "request finished",
            extra={
                "request_id": req.request_id,
                "tenant_id": req.tenant_id,
                "status": record.status,
                "completion_tokens": record.counts["completion_tokens"],
            },
        )
