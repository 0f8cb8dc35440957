# The usage record a worker emits on fleetlm:metering when a request ends, whatever the end.
# Times are measured from the API's enqueue time (the engine's arrival_time is set to it).
from __future__ import annotations

import time
from typing import Any

from service import streams as p


def _ms(start: float | None, end: float | None) -> str:
    return "" if start is None or end is None else f"{(end - start) * 1000:.3f}"


def usage_record(
    req: p.QueuedRequest, event: dict[str, Any], delta: Any, worker_id: str
) -> dict[str, str]:
    """The request's one metering record; `delta` is the engine's final delta, if any."""
    now = time.time()
    usage = event.get("usage") or {}
    if delta is not None:
        reason = delta.finish_reason
        status = p.STATUS_BY_FINISH_REASON[reason]
        arrival, scheduled = delta.arrival_time, delta.first_scheduled_time
        first, finished = delta.first_token_time, delta.finish_time or now
    else:
        reason, status = "error", "failed"
        arrival, scheduled, first, finished = req.enqueued_at, None, None, now
    n = int(usage.get("completion_tokens", 0))
    tpot = ""
    if first is not None and n > 1:
        tpot = f"{(finished - first) * 1000 / (n - 1):.3f}"
    record = {
        "request_id": req.request_id,
        "tenant_id": req.tenant_id,
        "key_id": req.key_id,
        "model": req.model,
        "priority": req.priority,
        "endpoint": req.endpoint,
        "batch_id": req.batch_id or "",
        "status": status,
        "finish_reason": reason,
        "prompt_tokens": usage.get("prompt_tokens", len(req.prompt_token_ids)),
        "cached_tokens": usage.get("cached_tokens", 0),
        "completion_tokens": n,
        "preemptions": usage.get("preemptions", 0),
        "spec_proposed_tokens": usage.get("spec_proposed_tokens", 0),
        "spec_accepted_tokens": usage.get("spec_accepted_tokens", 0),
        "queue_ms": _ms(arrival, scheduled if scheduled is not None else finished),
        "ttft_ms": _ms(arrival, first),
        "tpot_ms": tpot,
        "e2e_ms": _ms(arrival, finished),
        "worker_id": worker_id,
        "enqueued_at": f"{req.enqueued_at:.6f}",
        "finished_at": f"{finished:.6f}",
        "error": event.get("message", "") if event["type"] == "error" else "",
    }
    return {k: str(record[k]) for k in p.USAGE_FIELDS}


class BusyMeter:
    """Seconds spent inside engine steps per aligned interval; one record per closed interval
    (kind=worker_busy on fleetlm:metering), so GPU utilisation can be priced per worker."""

    def __init__(self, worker_id: str, interval_s: int) -> None:
        self.worker_id, self.interval_s = worker_id, max(1, interval_s)
        self.start = self._aligned(time.time())
        self.busy_s, self.num_steps = 0.0, 0

    def _aligned(self, t: float) -> int:
        return int(t // self.interval_s) * self.interval_s

    def add(self, seconds: float) -> None:
        self.busy_s += seconds
        self.num_steps += 1

    def due(self, now: float | None = None) -> dict[str, str] | None:
        """The record of the interval that just closed, if one did (then a new one starts)."""
        start = self._aligned(time.time() if now is None else now)
        return self.flush(start) if start != self.start else None

    def flush(self, next_start: int | None = None) -> dict[str, str] | None:
        record = None
        if self.num_steps:
            record = {
                "kind": "worker_busy",
                "worker_id": self.worker_id,
                "interval_start": str(self.start),
                "interval_s": str(self.interval_s),
                "busy_ms": str(round(self.busy_s * 1000)),
                "num_steps": str(self.num_steps),
            }
        self.start = next_start if next_start is not None else self._aligned(time.time())
        self.busy_s, self.num_steps = 0.0, 0
        return record
