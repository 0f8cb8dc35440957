# The records on fleetlm:metering and their one codec. A worker writes one RequestRecord per
# finished request, whatever its end, and a BusyRecord per closed busy interval; the metering
# writer decodes them into usage_records and worker_busy rows. An entry is {"kind", "r": JSON},
# so counts, milliseconds, nulls and epoch timestamps cross the stream as numbers.
# Adding a usage counter touches the engine's RequestUsage, UsageCounts here, the usage_records
# model and a migration; the worker, the events and the writer carry every counter as it comes.
from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict, cast

METERING_STREAM = "fleetlm:metering"
REQUEST_KIND = "request"
BUSY_KIND = "worker_busy"


class UsageCounts(TypedDict):
    """One request's counters: the engine's RequestUsage field for field (the worker passes
    dataclasses.asdict of it), each a usage_records column of the same name."""

    prompt_tokens: int
    cached_tokens: int  # part of prompt_tokens
    completion_tokens: int
    preemptions: int
    # Speculative decoding: draft tokens proposed and accepted (accepted ones are in
    # completion_tokens; the rest cost GPU time but are not billed as output).
    spec_proposed_tokens: int
    spec_accepted_tokens: int


COUNTERS: tuple[str, ...] = tuple(UsageCounts.__annotations__)


def usage_counts(counts: dict[str, Any] | None = None) -> UsageCounts:
    """Every counter, as an int; zero where absent (a request that never ran knows none)."""
    counts = counts or {}
    return cast(UsageCounts, {k: int(counts.get(k, 0)) for k in COUNTERS})


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
    counts: UsageCounts
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
    return RequestRecord(**payload | {"counts": usage_counts(payload["counts"])})
