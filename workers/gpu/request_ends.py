# How a GPU worker's requests end other than by finishing: a Redis outage past its bound, drain
# (SIGTERM) and shutdown. Every end bills what the client was sent (workers/gpu/outbox.py), once.
from __future__ import annotations

import logging
import threading
import time

from engine import LLMEngine
from service import streams as p
from service.events import ErrorEvent, error_event
from service.redis_clients import UNREACHABLE, Backoff
from service.settings import Settings
from workers.gpu.inflight import Inflight
from workers.gpu.metrics import WorkerMetrics
from workers.gpu.metrics_publisher import MetricsPublisher
from workers.gpu.outbox import Outbox
from workers.gpu.round_trip import RoundTrip
from workers.gpu.usage import BusyMeter
from workers.gpu.work_intake import forget_call

log = logging.getLogger("fleetlm.worker")

SHUTDOWN_ATTEMPTS_S = 10.0  # the last round trip is retried this long while Redis is away


class RequestEnds:
    def __init__(
        self,
        *,
        settings: Settings,
        worker_id: str,
        engine: LLMEngine,
        inflight: dict[str, Inflight],
        lock: threading.Lock,
        outbox: Outbox,
        trip: RoundTrip,
        busy: BusyMeter,
        metrics: WorkerMetrics,
        metrics_publisher: MetricsPublisher,
        stopping: threading.Event,
    ) -> None:
        self.settings, self.worker_id, self.engine = settings, worker_id, engine
        self.inflight, self.lock, self.outbox, self.trip = inflight, lock, outbox, trip
        self.busy, self.metrics, self.metrics_publisher = busy, metrics, metrics_publisher
        self.stopping = stopping
        self._drain_deadline: float | None = None

    def ride_out_outage(self) -> None:
        """Redis is away: no step (nobody could receive its tokens), retry the round trip."""
        outage = self.trip.outage
        assert outage.active
        if not outage.requests_ended and outage.lasted() > self.settings.redis_outage_s:
            self._end_all(
                error_event(
                    f"Redis was unreachable for more than {self.settings.redis_outage_s:.0f}s",
                    "redis_unavailable",
                ),
                through=lambda f: f.confirmed_tokens,
                drop_waiting=True,
            )
            outage.requests_ended = True
        self.stopping.wait(outage.backoff.next_s())
        reply = self.trip.run(busy=False)
        if reply is not None:
            self.trip.apply(*reply, -1)

    def _end_all(self, event: ErrorEvent, *, through, drop_waiting: bool) -> None:
        """Ends every request this worker runs with `event`, billed `through(request)` output
        tokens. `drop_waiting`: their deltas not yet published are dropped (Redis was away: the
        client's stream already ended where it stopped), else published before the end."""
        ended = set()
        ending = self.outbox.failing()
        if not drop_waiting:  # an end the engine produced, waiting to be published, stands
            ending |= self.outbox.finishing()
        with self.lock:
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

    def drained(self) -> bool:
        """Drain bookkeeping at the top of each loop turn; True once nothing is left to run."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.settings.drain_timeout_s
            unstarted = self.hand_back_unstarted()
            log.info("draining: handed back %d, finishing %d", unstarted, len(self.inflight))
        if not self.inflight and not self.outbox.failed and not self.outbox.requeues:
            return True
        if time.monotonic() > self._drain_deadline:
            log.warning("drain deadline passed with %d requests running", len(self.inflight))
            return True
        return False

    def shutdown(self) -> None:
        """Publishes what waits, ends the requests still streaming (`shutdown`, billed as
        published), hands unstarted ones back to their queue, and leaves the worker set."""
        self.metrics_publisher.close()  # before the key is deleted below, which it would undo
        self.hand_back_unstarted()
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
                exchange = self.trip.build(busy=False, final=True)
                exchange.pipe.delete(
                    p.alive_key(self.worker_id),
                    p.stats_key(self.worker_id),
                    p.metrics_key(self.worker_id),
                    p.blocks_key(self.worker_id),
                )
                exchange.pipe.srem(p.WORKERS_SET, self.worker_id)
                # Off the routes if nothing waits on its queues; else the others drain them.
                exchange.pipe.eval(*forget_call(self.worker_id))
                exchange.pipe.execute()
                self.trip.confirm(exchange)
                return
            except UNREACHABLE as exc:
                if time.monotonic() > deadline:
                    log.warning("could not hand back work on shutdown: %s", exc)
                    return
                time.sleep(backoff.next_s())

    def hand_back_unstarted(self) -> int:
        """Requests that have not streamed yet go back to their queue, for any worker."""
        failing = self.outbox.failing()
        with self.lock:
            unstarted = [
                f
                for f in self.inflight.values()
                if not f.published and f.final is None and f.request_id not in failing
            ]
            for f in unstarted:
                del self.inflight[f.request_id]
        for f in unstarted:
            self._abort(f.request_id)
            self.metrics.forget(f.request_id, f.req.sampling.n)
        self.outbox.requeues += unstarted
        return len(unstarted)

    def _abort(self, request_id: str) -> bool:
        try:
            return self.engine.abort(request_id)
        except RuntimeError:  # an error escaped mid-step (shutting down): nothing to free
            return False
