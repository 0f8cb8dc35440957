# The per-step Redis round trip of a GPU worker: one pipelined trip publishes what the outbox
# holds (deltas, finishes, fails, hand-backs), reads cancel flags, writes the engine's stats and
# the prefix blocks it cached or evicted (workers/prefix_publisher.py), XAUTOCLAIMs the entries of
# dead workers and re-reads the routed workers now and then, and takes new work
# (workers/work_intake.py); `_apply` then acts on what came back. A trip Redis did not take
# leaves everything in the outbox for the next one.
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from service import streams as p
from service.redis_clients import UNREACHABLE
from workers.intake_budget import intake_budget
from workers.outbox import Written
from workers.prefix_publisher import BlocksWritten
from workers.work_intake import Intake, forget_call, taken_entries

log = logging.getLogger("fleetlm.worker")


@dataclass(slots=True)
class Exchange:
    """One step's Redis round trip, and where its replies land in the results."""

    pipe: redis.client.Pipeline
    written: Written  # what it carries out of the outbox
    ids: list[str] = field(default_factory=list)  # inflight ids whose cancel keys were read
    leased: list[str] = field(default_factory=list)  # ... and whose leases were read
    streams: list[str] = field(default_factory=list)  # queues XAUTOCLAIMed, in order
    blocks: BlocksWritten | None = None  # prefix blocks published
    at_cancels: int = -1
    at_leases: int = -1
    at_reclaim: int = -1
    at_routes: int = -1  # the routed workers (SMEMBERS), read with the XAUTOCLAIMs
    at_take: int = -1  # the take script's reply (workers/work_intake.py)
    at_read: int = -1  # an idle worker's blocking XREADGROUP reply
    idle: bool = False  # nothing to step: the read may block
    build_s: float = 0.0
    io_s: float = 0.0
    read_streams: list[str] = field(default_factory=list)  # the queues work may be read from
    room: int = 0  # how many new requests the engine may take this turn

    def num_read(self, results: list) -> int:
        """New entries the round trip took (the take script, or the blocking read)."""
        if self.at_take >= 0:
            return len(results[self.at_take] or [])
        if self.at_read >= 0:
            return sum(len(entries) for _, entries in results[self.at_read] or [])
        return 0


class RoundTrip:
    """The GpuWorker's round-trip half (mixed into workers.gpu_worker.GpuWorker)."""

    def _round_trip(self, *, busy: bool) -> tuple[Exchange, list] | None:
        """Publish what waits, read cancels and new work: one pipelined round trip. `busy`: a
        step is running, so the read must not block. None when Redis did not answer."""
        t0 = time.perf_counter()
        exchange = self._build(busy=busy)
        t1 = time.perf_counter()
        try:
            results = _checked(exchange, exchange.pipe.execute(raise_on_error=False))
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # A Redis that came back without the queues' consumer group (a replica promoted
            # from an empty one, say): recreate it; what this trip carried is sent again.
            log.warning("the queues' consumer group is gone; recreating it")
            self._until_redis_answers(self._create_groups)
            self.prefix.rewrite = True
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
            self._reset_leases()
        self._confirm(exchange)
        self.prefix.confirm(exchange.blocks, results)
        if exchange.idle and exchange.at_read < 0 and not exchange.num_read(results):
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
            exchange.at_leases = len(pipe)
            exchange.leased = self._read_leases(pipe, ids)
        stats = self.engine.stats()
        self.budget = budget = intake_budget(self.engine, self.prices, self.load, self.settings)
        self.metrics.on_budget(budget)
        mapping = self._stats_mapping(stats) | self._routed_inflight(exchange.written)
        pipe.hset(p.stats_key(self.worker_id), mapping=mapping)
        pipe.expire(p.stats_key(self.worker_id), 60)
        exchange.blocks = self.prefix.write(pipe)
        self.metrics.published_blocks.set(self.prefix.num_published)
        if self.metrics.snapshot_due(stats, self.draining.is_set()):
            self.metrics_publisher.submit()  # serialised and written off this thread

        # Only what the engine can start at the TPOT target (workers/intake_budget.py); batch
        # work only with headroom, leaving room for an interactive arrival (which would
        # otherwise preempt it), and then no more than that room this turn.
        room = budget.interactive_room
        if self.draining.is_set() or self.outage_since is not None:
            room = 0
        priorities = ["interactive"]
        free_frac = stats.num_free_blocks / max(stats.num_total_blocks, 1)
        if (
            room > 0
            and budget.batch_room > 0
            and free_frac >= self.settings.batch_min_free_kv
            and stats.num_waiting <= self.settings.batch_max_waiting
        ):
            priorities.append("batch")
            room = min(room, budget.batch_room)
        intake: Intake = self.intake
        streams = intake.read_streams(priorities)
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
            exchange.streams = intake.all_queues(priorities)
            for queue in exchange.streams:
                start = self._claim_cursor.get(queue, "0-0")
                pipe.xautoclaim(
                    queue, p.GROUP, self.worker_id, self._dead_after_ms, start, count=max(room, 2)
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
        elif room > 0:
            steal = self.settings.steal_max_waiting
            may_steal = steal >= 0 and stats.num_waiting <= steal
            exchange.at_take = len(pipe)
            age = self.settings.steal_min_age_s
            pipe.eval(*intake.take_call(priorities, room, may_steal, age))
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
                self.load.on_finished(completion, record.counts["prompt_tokens"])
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
        if exchange.leased:
            self._check_leases(exchange.leased, results[exchange.at_leases])
        if exchange.streams:
            claims = results[exchange.at_reclaim : exchange.at_reclaim + len(exchange.streams)]
            for queue, claimed in zip(exchange.streams, claims):
                if isinstance(claimed, redis.ResponseError):
                    continue  # a dead worker's queue, removed since the routes were read
                self._claim_cursor[queue] = claimed[0]
                self._admit_reclaimed(queue, claimed[1])
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
            self._took(self.intake.how(queue))
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

    def _routed_inflight(self, written: Written) -> dict[str, int]:
        # The entries this trip acknowledges (ends, hand-backs, drops) leave the pending list
        # with it: the stats written in the same trip must not count them.
        ended = {f.entry_id for f, _ in written.finished}
        ended.update(f.entry_id for f in self.outbox.requeues[: written.num_requeues])
        ended.update(entry_id for _, entry_id in self.outbox.acks[: written.num_acks])
        return self.intake.routed_inflight(self._owned(), ended)

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
            "num_waiting_tokens": stats.num_waiting_tokens,
            "published_blocks": self.prefix.num_published,
            **{f"taken_{how}": n for how, n in self.taken.items()},
            "draining": int(self.draining.is_set()),
            "model": self.settings.model_name,
            "updated_at": f"{time.time():.3f}",
            **self.load.fields(),
            **(self.budget.fields() if self.budget is not None else {}),
        }


def _checked(exchange: Exchange, results: list) -> list:
    """Raises the first error of the round trip's replies, but for the XAUTOCLAIMs': a queue
    scanned may have been removed meanwhile (workers/work_intake.py's FORGET_SCRIPT)."""
    claims = range(exchange.at_reclaim, exchange.at_reclaim + len(exchange.streams))
    for i, reply in enumerate(results):
        if isinstance(reply, Exception) and i not in claims:
            raise reply
    return results
