# The Redis names the API, the workers, the batch runner and the metering writer share. Keys:
#   fleetlm:q:{interactive|batch}   stream of queued requests (service/queued_request.py),
#                                   consumer group "workers"; an entry is XACKed and XDELed when
#                                   its request ends, so XLEN = queued + running (what the API's
#                                   queue limit counts)
#   fleetlm:out:{request_id}        stream of output events for one request (service/events.py;
#                                   expires)
#   fleetlm:q:{priority}:tokens     the work queued and not yet read by a worker, in tokens
#                                   (prompt + expected output; admission adds, workers subtract;
#                                   the API's load shedding reads it)
#   fleetlm:cancel:{request_id}     string set by the API when the client goes away (expires):
#                                   "n=<tokens>" when it knows how many tokens the client got
#   fleetlm:metering                stream of one usage record per finished request, and the
#                                   workers' busy records (metering/records.py)
#   fleetlm:workers                 set of worker ids ever registered (pruned when dead)
#   fleetlm:worker:{id}:alive       heartbeat, a key with a TTL of worker_dead_after_s
#   fleetlm:worker:{id}:stats       hash of engine stats, rewritten every step
#   fleetlm:worker:{id}:metrics     the worker's Prometheus exposition text, rewritten about
#                                   once a second; expires like the heartbeat
#   fleetlm:worker:{id}:control     list of control commands for that worker (service/control.py;
#                                   expires)
#   fleetlm:control:{token}         list a control command's replies go to (expires)
# Tenant limits keep their own keys beside their scripts (metering/ratelimit.py).
from __future__ import annotations

from metering.ratelimit import PRIORITIES as PRIORITIES
from metering.ratelimit import Priority
from metering.records import METERING_STREAM as METERING_STREAM

GROUP = "workers"
WORKERS_SET = "fleetlm:workers"


def queue_key(priority: Priority) -> str:
    return f"fleetlm:q:{priority}"


def output_key(request_id: str) -> str:
    return f"fleetlm:out:{request_id}"


def queued_tokens_key(priority: Priority) -> str:
    return f"fleetlm:q:{priority}:tokens"


def cancel_key(request_id: str) -> str:
    return f"fleetlm:cancel:{request_id}"


def cancel_value(delivered: int | None) -> str:
    """A cancel flag's value: the output tokens the client received, when the canceller knows."""
    return "1" if delivered is None else f"n={delivered}"


def delivered_of(value: str | None) -> int | None:
    if value is None or not value.startswith("n="):
        return None
    return int(value[2:])


def alive_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:alive"


def stats_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:stats"


def metrics_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:metrics"


def control_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:control"


def control_reply_key(token: str) -> str:
    return f"fleetlm:control:{token}"
