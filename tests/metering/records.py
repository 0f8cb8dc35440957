# Synthetic usage records in the exact wire format workers emit (workers/protocol.py).
from __future__ import annotations

import time
import uuid

from service import streams as p


def usage_fields(tenant_id: uuid.UUID, **over) -> dict[str, str]:
    now = time.time()
    record = {
        "request_id": f"cmpl-{uuid.uuid4().hex}",
        "tenant_id": str(tenant_id),
        "key_id": str(uuid.uuid4()),
        "model": "tiny",
        "priority": "interactive",
        "endpoint": "completions",
        "batch_id": "",
        "status": "completed",
        "finish_reason": "stop",
        "prompt_tokens": 10,
        "cached_tokens": 4,
        "completion_tokens": 7,
        "preemptions": 0,
        "spec_proposed_tokens": 0,
        "spec_accepted_tokens": 0,
        "queue_ms": "1.5",
        "ttft_ms": "20.0",
        "tpot_ms": "5.0",
        "e2e_ms": "50.0",
        "worker_id": "w-test",
        "enqueued_at": f"{now - 0.05:.6f}",
        "finished_at": f"{now:.6f}",
        "error": "",
    } | over
    return {k: str(record[k]) for k in p.USAGE_FIELDS}
