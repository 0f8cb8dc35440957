# The Redis names the API, the workers, the batch runner and the metering writer share. Keys:
#   fleetlm:q:{interactive|batch}   stream of queued requests (service/queued_request.py),
#                                   consumer group "workers"; an entry is XACKed and XDELed when
#                                   its request ends, so XLEN = queued + running (what the API's
#                                   queue limit counts)
#   fleetlm:out:{request_id}        stream of output events for one request (service/events.py;
#                                   expires)
#   fleetlm:q:{priority}:w:{id}     the same, routed to worker {id} (service/routing.py): the
#                                   worker reads it first, others take from it when idle or
#                                   when {id} is dead or draining
#   fleetlm:routes                  set of worker ids whose queues may hold entries (a worker
#                                   adds itself; one that is dead with empty queues is removed)
#   fleetlm:q:{priority}:tokens     the work queued and not yet read by a worker, in tokens
#                                   (prompt + expected output; admission adds, workers subtract;
#                                   the API's load shedding reads it)
#   fleetlm:cancel:{request_id}     string set by the API when the client goes away (expires):
#                                   "n=<tokens>" when it knows how many tokens the client got
#   fleetlm:lease:{request_id}      string the API process relaying the request rewrites while its
#                                   client is connected ("n=<tokens sent>", with a TTL): gone,
#                                   the process died and the worker stops the request
#                                   (api/client_leases.py, workers/gpu/client_leases.py)
#   fleetlm:metering                stream of one usage record per finished request, and the
#                                   workers' busy records (metering/records.py)
#   fleetlm:workers                 set of worker ids ever registered (pruned when dead)
#   fleetlm:worker:{id}:alive       heartbeat, a key with a TTL of worker_dead_after_s
#   fleetlm:worker:{id}:stats       hash of engine stats, rewritten every step
#   fleetlm:worker:{id}:blocks      set of the prefix-cache block hashes the worker holds (hex;
#                                   the first routing_max_blocks of each prefix, bounded);
#                                   expires like the heartbeat
#   fleetlm:worker:{id}:metrics     the worker's Prometheus exposition text, rewritten about
#                                   once a second; expires like the heartbeat
#   fleetlm:worker:{id}:control     list of control commands for that worker (service/control.py;
#                                   expires)
#   fleetlm:control:{token}         list a control command's replies go to (expires)
# Tenant limits keep their own keys beside their scripts (service/limit_reservations.py); the
# Lua that reads who holds a queue entry is service/queue_ownership.py.
from __future__ import annotations

from engine.priority import PRIORITIES as PRIORITIES
from engine.priority import Priority
from metering.records import METERING_STREAM as METERING_STREAM

GROUP = "workers"
WORKERS_SET = "fleetlm:workers"
ROUTES_SET = "fleetlm:routes"


def queue_key(priority: Priority) -> str:
    return f"fleetlm:q:{priority}"


def worker_queue_key(worker_id: str, priority: Priority) -> str:
    return f"fleetlm:q:{priority}:w:{worker_id}"


def queue_keys(priority: Priority, routes: list[str]) -> list[str]:
    """Every queue of a priority: the shared one, then each routed worker's."""
    return [queue_key(priority), *(worker_queue_key(w, priority) for w in routes)]


def output_key(request_id: str) -> str:
    return f"fleetlm:out:{request_id}"


def queued_tokens_key(priority: Priority) -> str:
    return f"fleetlm:q:{priority}:tokens"


def cancel_key(request_id: str) -> str:
    return f"fleetlm:cancel:{request_id}"


def cancel_value(delivered: int | None) -> str:
    """A cancel flag's value: the output tokens the client received, when the canceller knows."""
    return "1" if delivered is None else f"n={delivered}"


def lease_key(request_id: str) -> str:
    return f"fleetlm:lease:{request_id}"


def delivered_of(value: str | None) -> int | None:
    if value is None or not value.startswith("n="):
        return None
    return int(value[2:])


def alive_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:alive"


def stats_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:stats"


def blocks_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:blocks"


def metrics_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:metrics"


def control_key(worker_id: str) -> str:
    return f"fleetlm:worker:{worker_id}:control"


def control_reply_key(token: str) -> str:
    return f"fleetlm:control:{token}"
