# Synthetic usage records, as workers emit them (metering/records.py).
from __future__ import annotations

import time
import uuid

from engine.usage import RequestUsage
from metering.records import RequestRecord


def usage_record(tenant_id: uuid.UUID, **over) -> RequestRecord:
    """A completed request's record; keyword arguments override fields or counters."""
    now = time.time()
    counts = {"prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 7}
    counts |= {k: over.pop(k) for k in RequestUsage.__dataclass_fields__ if k in over}
    fields = {
        "request_id": f"cmpl-{uuid.uuid4().hex}",
        "tenant_id": str(tenant_id),
        "key_id": str(uuid.uuid4()),
        "model": "tiny",
        "priority": "interactive",
        "endpoint": "completions",
        "batch_id": None,
        "status": "completed",
        "finish_reason": "stop",
        "error": None,
        "counts": RequestUsage.from_json(counts).to_json(),
        "queue_ms": 1.5,
        "ttft_ms": 20.0,
        "tpot_ms": 5.0,
        "e2e_ms": 50.0,
        "worker_id": "w-test",
        "enqueued_at": now - 0.05,
        "finished_at": now,
    }
    return RequestRecord(**fields | over)
