# A request's API process must stay alive while it streams: it rewrites the request's lease
# (api/client_leases.py) every api_lease_refresh_s. Each round trip reads the leases of the
# worker's leased requests beside their cancel flags; a lease seen missing for api_lease_ttl_s
# on this worker's clock means the process that relayed the request is gone (killed, crashed),
# and the request is stopped as a cancel is: billed what the lease last said its client was
# sent (never more than the engine produced). Missing for a while on the worker's own clock, not
# at the first read: a Redis pause longer than the TTL expires every lease at once, and the API
# processes rewrite them within one refresh once Redis answers again. After an outage the
# worker forgets when it saw them missing (reset).
from __future__ import annotations

import logging
import threading
import time

from engine import LLMEngine
from service import streams as p
from workers.gpu.inflight import Inflight

log = logging.getLogger("fleetlm.worker")


class ClientLeaseWatch:
    def __init__(
        self,
        engine: LLMEngine,
        inflight: dict[str, Inflight],
        lock: threading.Lock,
        lease_ttl_s: float,
    ) -> None:
        self.engine, self.inflight, self.lock = engine, inflight, lock
        self.lease_ttl_s = lease_ttl_s

    def read(self, pipe, ids: list[str]) -> list[str]:
        """Queues the reads of the leases of `ids`' leased requests; returns their ids."""
        leased = [i for i in ids if self.inflight[i].req.leased]
        if leased:
            pipe.mget([p.lease_key(i) for i in leased])
        return leased

    def check(self, leased: list[str], values: list[str | None]) -> bool:
        """Stops the requests whose lease has been missing too long; True when one freed its KV
        blocks (the step counts as a cancel's)."""
        aborted = False
        now = time.monotonic()
        for request_id, value in zip(leased, values):
            f = self.inflight.get(request_id)
            if f is None or f.cancel_delivered is not None:
                continue
            if value is not None:
                f.lease_delivered = p.delivered_of(value) or 0
                f.lease_missing_since = None
                continue
            if f.lease_missing_since is None:
                f.lease_missing_since = now
                continue
            if now - f.lease_missing_since < self.lease_ttl_s:
                continue
            f.cancel_delivered = f.lease_delivered
            if self.engine.abort(request_id):
                aborted = True
                log.warning(
                    "the API process relaying %s is gone: stopped after %d tokens sent",
                    request_id,
                    f.lease_delivered,
                )
        return aborted

    def reset(self) -> None:
        """Redis was away: every lease may have lapsed meanwhile; judge them afresh."""
        with self.lock:
            for f in self.inflight.values():
                f.lease_missing_since = None
