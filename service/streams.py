# The Redis wire format shared by the API and the workers. Torch-free and engine-free: the API
# imports it. Keys:
#   fleetlm:q:{interactive|batch}   stream of queued requests, consumer group "workers";
#                                   an entry is XACKed and XDELed when its request ends, so
#                                   XLEN = queued + running (what the API's queue limit counts)
#   fleetlm:out:{request_id}        stream of output events for one request (expires)
#   fleetlm:cancel:{request_id}     string set by the API when the client goes away (expires)
#   fleetlm:metering                stream of one usage record per finished request
#   fleetlm:workers                 set of worker ids ever registered (pruned when dead)
#   fleetlm:worker:{id}:alive       heartbeat, a key with a TTL of worker_dead_after_s
#   fleetlm:worker:{id}:stats       hash of engine stats, rewritten every step
#   fleetlm:worker:{id}:metrics     the worker's Prometheus exposition text, rewritten about
#                                   once a second; expires like the heartbeat
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

PRIORITY_CLASSES = ("interactive", "batch")
GROUP = "workers"
METERING_STREAM = "fleetlm:metering"
WORKERS_SET = "fleetlm:workers"


def queue_key(priority: str) -> str:
    return f"fleetlm:q:{priority}"


def output_key(request_id: str) -> str:
    return f"fleetlm:out:{request_id}"


def cancel_key(request_id: str) -> str:
    return f"fleetlm:cancel:{request_id}"


def alive_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:alive"


def stats_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:stats"


def metrics_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:metrics"


# Atomic admission against the queue limit: XADD only while XLEN is under ARGV[1].
ENQUEUE_SCRIPT = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
return redis.call('XADD', KEYS[1], '*', 'r', ARGV[2])
"""


@dataclass(slots=True)
class QueuedRequest:
    request_id: str
    tenant_id: str
    key_id: str
    model: str
    endpoint: str  # "chat.completions" | "completions"
    priority: str  # "interactive" | "batch"
    prompt_token_ids: list[int]
    sampling: dict[str, Any]  # engine SamplingParams fields
    enqueued_at: float  # wall clock (time.time()) at admission
    batch_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | bytes) -> QueuedRequest:
        return cls(**json.loads(raw))


# Output events, one JSON object in field "e" of each fleetlm:out:{id} entry:
#   {"type": "delta", "text": str, "worker": id, "completion_tokens": n}
#   {"type": "done", "text": str, "worker": id, "finish_reason": "stop"|"length",
#    "usage": {"prompt_tokens", "cached_tokens", "completion_tokens", "preemptions",
#              "spec_proposed_tokens", "spec_accepted_tokens"}}
#   {"type": "error", "message": str, "code": str, "worker": id | None, "usage": {...} | None}
# "done" and "error" are final; a relay stops reading there.
FINAL_EVENTS = ("done", "error")


def encode_event(event: dict[str, Any]) -> dict[str, str]:
    return {"e": json.dumps(event, separators=(",", ":"))}


def decode_event(fields: dict) -> dict[str, Any]:
    raw = fields.get("e", fields.get(b"e"))
    return json.loads(raw)


# Usage record fields (strings, as stream fields are) on fleetlm:metering.
USAGE_FIELDS = (
    "request_id", "tenant_id", "key_id", "model", "priority", "endpoint", "batch_id",
    "status", "finish_reason", "prompt_tokens", "cached_tokens", "completion_tokens",
    "preemptions", "spec_proposed_tokens", "spec_accepted_tokens",
    "queue_ms", "ttft_ms", "tpot_ms", "e2e_ms", "worker_id",
    "enqueued_at", "finished_at", "error",
)  # fmt: skip

STATUS_BY_FINISH_REASON = {
    "stop": "completed",
    "length": "length",
    "abort": "cancelled",
    "error": "failed",
}
