# A worker's heartbeat, on its own thread and Redis connection: every heartbeat_interval_s it
# refreshes the worker's alive key (TTL worker_dead_after_s) and resets the idle time of the
# queue entries it runs, so XAUTOCLAIM by other workers takes only the entries of a worker that
# stopped heartbeating. Fenced (service/queue_ownership.py): an entry no longer pending on this
# worker was claimed by another while this one was cut off from Redis; it is reported as lost, and
# the step loop drops the request without a word (the other worker runs and bills it).
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import redis

from service.queue_ownership import heartbeat_call

log = logging.getLogger("fleetlm.worker")


class Heartbeat:
    def __init__(
        self,
        client: redis.Redis,
        worker_id: str,
        model_name: str,
        ttl_ms: int,
        owned: Callable[[], list[tuple[str, str]]],
    ) -> None:
        self.client, self.worker_id, self.ttl_ms = client, worker_id, ttl_ms
        self.info = {"pid": os.getpid(), "model": model_name}
        self.owned = owned  # (queue, entry id) of every request the worker runs; thread-safe
        self._lost: list[str] = []
        self._lock = threading.Lock()

    def beat(self) -> None:
        call = heartbeat_call(self.worker_id, self.info, self.ttl_ms, self.owned())
        lost = self.client.eval(*call)
        if lost:
            with self._lock:
                self._lost += lost

    def take_lost(self) -> set[str]:
        """Entry ids found claimed by another worker since the last call."""
        with self._lock:
            lost, self._lost = set(self._lost), []
        return lost

    def run(self, stop: threading.Event, interval_s: float) -> None:
        failing = False
        while not stop.wait(interval_s):
            try:
                self.beat()
                failing = False
            except redis.RedisError as exc:
                if not failing:  # once per outage, not every beat
                    log.warning("heartbeat failed: %s", exc)
                failing = True
