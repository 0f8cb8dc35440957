# The records on fleetlm:metering and their one codec. A worker writes one RequestRecord per
# finished request, whatever its end, and a BusyRecord per closed busy interval; the metering
# writer decodes them into usage_records and worker_busy rows. An entry is {"kind", "r": JSON},
# so counts, milliseconds, nulls and epoch timestamps cross the stream as numbers. A request's
# usage counters come as the engine's usage record wrote them (engine/usage.py, which says what
# adding a counter touches): metering imports no engine and names no counter, it writes each to
# the usage_records column of the same name.
from __future__ import annotations

import functools
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

METERING_STREAM = "fleetlm:metering"
REQUEST_KIND = "request"
BUSY_KIND = "worker_busy"


@functools.cache
def _usage_columns() -> frozenset[str]:
    # Imported here, not above: the workers encode records but never write rows, and SQLAlchemy's
    # ORM was a third of a worker's imports besides torch (0.85 of 1.9 s).
    from metering.models import UsageRecord

    return frozenset(UsageRecord.__table__.columns.keys())


def _time(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    request_id: str
    tenant_id: str
    key_id: str | None
    model: str
    priority: str  # interactive | batch
    endpoint: str  # chat.completions | completions
    batch_id: str | None
    status: str  # completed | length | cancelled | failed
    finish_reason: str  # stop | length | abort | error
    error: str | None
    counts: dict[str, int]  # engine.usage.RequestUsage.to_json(): counter name → count
    queue_ms: float | None  # from the API's enqueue
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    worker_id: str | None
    enqueued_at: float  # wall clock, epoch seconds
    finished_at: float

    def row(self) -> dict[str, Any]:
        """Its usage_records row, before pricing."""
        row = asdict(self)
        counts, enqueued_at = row.pop("counts"), row.pop("enqueued_at")
        # A counter with no column yet (a worker ahead of the migration) is not written, rather
        # than the row refused: the request is billed either way.
        columns = _usage_columns()
        counts = {k: v for k, v in counts.items() if k in columns}
        return (
            row
            | counts
            | {
                "tenant_id": uuid.UUID(self.tenant_id),
                "key_id": uuid.UUID(self.key_id) if self.key_id else None,
                "created_at": _time(enqueued_at),
                "finished_at": _time(self.finished_at),
            }
        )


@dataclass(slots=True, kw_only=True)
class BusyRecord:
    """Seconds a worker spent inside engine steps over one aligned interval."""

    worker_id: str
    interval_start: int  # epoch seconds, a multiple of interval_s
    interval_s: int
    busy_ms: int
    num_steps: int

    def row(self) -> dict[str, Any]:
        return asdict(self) | {"interval_start": _time(self.interval_start)}


def encode_record(record: RequestRecord | BusyRecord) -> dict[str, str]:
    kind = BUSY_KIND if isinstance(record, BusyRecord) else REQUEST_KIND
    return {"kind": kind, "r": json.dumps(asdict(record), separators=(",", ":"))}


def decode_record(fields: dict[str, str]) -> RequestRecord | BusyRecord:
    """Raises ValueError, KeyError or TypeError for a malformed entry (the writer dead-letters
    it)."""
    payload: dict[str, Any] = json.loads(fields["r"])
    if fields.get("kind") == BUSY_KIND:
        return BusyRecord(**payload)
    counts = {str(k): int(v) for k, v in payload["counts"].items()}
    return RequestRecord(**payload | {"counts": counts})
