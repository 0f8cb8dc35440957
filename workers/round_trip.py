# The per-step Redis round trip of a GPU worker: one pipelined trip publishes what the outbox
# holds (deltas, finishes, fails, hand-backs), reads cancel flags, writes the engine's stats,
# XAUTOCLAIMs the entries of dead workers now and then and reads new work; `_apply` then acts on
# what came back. A trip Redis did not take leaves everything in the outbox for the next one.
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from service import streams as p
from service.redis_clients import UNREACHABLE
from workers.outbox import Written

log = logging.getLogger("fleetlm.worker")


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


class RoundTrip:
    """The GpuWorker's round-trip half (mixed into workers.gpu_worker.GpuWorker)."""

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
