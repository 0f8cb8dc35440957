# The records a worker emits on fleetlm:metering (metering/records.py): one per request when it
# ends, whatever the end, and one per closed busy interval. Times are measured from the API's
# enqueue time (the engine's arrival_time is set to it).
from __future__ import annotations

import time

from engine.outputs import RequestDelta
from engine.usage import RequestUsage
from metering.records import BusyRecord, RequestRecord, encode_record
from service.events import DoneEvent, ErrorEvent
from workers.gpu.inflight import Inflight

STATUS_BY_FINISH_REASON = {
    "stop": "completed",
    "length": "length",
    "abort": "cancelled",
    "error": "failed",
}


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000, 3)


def usage_record(
    f: Inflight, event: DoneEvent | ErrorEvent, delta: RequestDelta | None, worker_id: str
) -> RequestRecord:
    """The request's one metering record; `delta` is the engine's final delta, if any. A
    resumed request is timed from its first run (its client's first token came from there)."""
    req, now = f.req, time.time()
    if delta is not None:
        reason = delta.finish_reason or "error"
        arrival, scheduled = delta.arrival_time, delta.first_scheduled_time
        first, finished = delta.first_token_time, delta.finish_time or now
    else:
        reason = "error"
        arrival, scheduled, first, finished = req.enqueued_at, None, None, now
    if f.first_token_time is not None:
        first, scheduled = f.first_token_time, f.scheduled_time or scheduled
    # The event carries the billed record (Inflight.usage); one that carries none billed only
    # its prompt.
    usage = RequestUsage.from_json(event.get("usage"), prompt_tokens=len(req.prompt_token_ids))
    n = usage.completion_tokens
    tpot = None
    if first is not None and n > 1:
        tpot = round((finished - first) * 1000 / (n - 1), 3)
    return RequestRecord(
        request_id=req.request_id,
        tenant_id=req.tenant_id,
        key_id=req.key_id,
        model=req.model,
        priority=req.priority,
        endpoint=req.endpoint,
        batch_id=req.batch_id,
        status=STATUS_BY_FINISH_REASON[reason],
        finish_reason=reason,
        error=event["message"] if event["type"] == "error" else None,
        counts=usage.to_json(),
        queue_ms=_ms(arrival, scheduled if scheduled is not None else finished),
        ttft_ms=_ms(arrival, first),
        tpot_ms=tpot,
        e2e_ms=_ms(arrival, finished),
        worker_id=worker_id,
        enqueued_at=req.enqueued_at,
        finished_at=finished,
    )


class BusyMeter:
    """Seconds spent inside engine steps per aligned interval; one record per closed interval
    (a BusyRecord on fleetlm:metering), so GPU utilisation can be priced per worker."""

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
        """The encoded record of the interval that just closed, if one did (then a new one
        starts)."""
        start = self._aligned(time.time() if now is None else now)
        return self.flush(start) if start != self.start else None

    def flush(self, next_start: int | None = None) -> dict[str, str] | None:
        record = None
        if self.num_steps:
            record = BusyRecord(
                worker_id=self.worker_id,
                interval_start=self.start,
                interval_s=self.interval_s,
                busy_ms=round(self.busy_s * 1000),
                num_steps=self.num_steps,
            )
        self.start = next_start if next_start is not None else self._aligned(time.time())
        self.busy_s, self.num_steps = 0.0, 0
        return None if record is None else encode_record(record)
