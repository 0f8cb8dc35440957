# GET /metrics (an admin key, or the metrics_port listener for the scraper: the series name
# tenants): the API's series (with several API processes, fleetlm/api_processes.py, the sum over
# them all through prometheus_client's multiprocess directory), the fleet's Redis-side state
# (queue depth per priority, metering lag, worker heartbeats) read at scrape time, and every live
# worker's own series (the snapshot each ships to fleetlm:worker:{id}:metrics) relabelled with
# worker="<id>", so one scrape target serves a small deployment. Large ones scrape workers directly
# (FLEETLM_WORKER_METRICS_PORT) and can ignore the worker-labelled copies here.
from __future__ import annotations

import os
import time
from collections.abc import Iterable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from starlette.types import ASGIApp, Receive, Scope, Send

from api.auth import forbidden
from api.deps import Credentials, State, authorization
from api.errors import ErrorResponse
from api.load_shedding import OVERLOAD_REFUSALS, PREDICTED_TTFT
from api.loop_watch import LOOP_LAG, LOOP_STALLS
from api.openapi import AUTHED, errors
from api.relay import live_workers
from service import streams as p
from service.errors import error_body
from service.settings import Settings

disable_created_metrics()

REGISTRY = CollectorRegistry()
ADMISSIONS = Counter(
    "fleetlm:admissions",
    "Requests admitted to a queue.",
    ["tenant", "priority"],
    registry=REGISTRY,
)
REJECTIONS = Counter(
    "fleetlm:rejections",
    "Requests refused at admission (429 over a tenant limit, 503 queue full or draining).",
    ["tenant", "priority", "status", "reason"],
    registry=REGISTRY,
)
ROUTED = Counter(
    "fleetlm:routed_requests",
    "Requests admitted, by where routing put them: a worker's own queue or the shared one.",
    ["priority", "to"],
    registry=REGISTRY,
)
# Admission's own series (api/load_shedding.py defines them: this module imports the app state).
REGISTRY.register(PREDICTED_TTFT)
REGISTRY.register(OVERLOAD_REFUSALS)
REGISTRY.register(LOOP_LAG)  # api/loop_watch.py
REGISTRY.register(LOOP_STALLS)
# With several API processes the gauges are summed (open requests) or maxed (draining) over the
# live ones.
OPEN_REQUESTS = Gauge(
    "fleetlm:api_open_requests", "Generation requests the API is relaying.", [],
    registry=REGISTRY, multiprocess_mode="livesum",
)  # fmt: skip
DRAINING = Gauge(
    "fleetlm:api_draining", "1 while an API process drains.", registry=REGISTRY,
    multiprocess_mode="livemax",
)  # fmt: skip

router = APIRouter(tags=["metrics"])


def on_metrics_listener(scope: Scope, settings: Settings) -> bool:
    """The request came in on metrics_port (the socket's own address: a client cannot fake it)."""
    server = scope.get("server")
    return bool(settings.metrics_port) and server is not None and server[1] == settings.metrics_port


class MetricsListenerGuard:
    """On the metrics listener, GET /metrics is the only route: the API is not served there."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and on_metrics_listener(scope, self.settings)
            and scope["path"] != "/metrics"
        ):
            body = error_body("Only /metrics is served on this port.", code="not_found")
            await ErrorResponse(body, status_code=404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def metrics_reader(request: Request, state: State, credentials: Credentials) -> None:
    if on_metrics_listener(request.scope, state.settings):
        return
    if not (await state.keys.verify(authorization(credentials))).is_admin:
        raise forbidden("/metrics needs an admin key (or scrape FLEETLM_METRICS_PORT)")


def _ms_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


async def _oldest_unwritten_ms(redis: Redis) -> int | None:
    """Entry time of the oldest usage record the metering group has not acknowledged."""
    try:
        groups = await redis.xinfo_groups(p.METERING_STREAM)
    except Exception:  # no stream yet
        return None
    group = next((g for g in groups if g["name"] == "metering"), None)
    if group is None:  # no writer ever ran: everything is unwritten
        first = await redis.xrange(p.METERING_STREAM, count=1)
        return _ms_of(first[0][0]) if first else None
    if group["pending"]:
        return _ms_of((await redis.xpending(p.METERING_STREAM, "metering"))["min"])
    after = await redis.xrange(p.METERING_STREAM, min=f"({group['last-delivered-id']}", count=1)
    return _ms_of(after[0][0]) if after else None


async def _fleet_families(
    redis: Redis, settings: Settings
) -> tuple[list[Metric], list[tuple[str, str]]]:
    workers = await live_workers(redis)
    routes = sorted(await redis.smembers(p.ROUTES_SET))
    queues = [(prio, q) for prio in p.PRIORITIES for q in p.queue_keys(prio, routes)]
    pipe = redis.pipeline(transaction=False)
    for _, queue in queues:
        pipe.xlen(queue)
        pipe.xpending(queue, p.GROUP)
    for w in workers:
        pipe.pttl(p.alive_key(w))
        pipe.get(p.metrics_key(w))
    results = await pipe.execute(raise_on_error=False)

    depth = GaugeMetricFamily(
        "fleetlm:queue_depth",
        "Requests queued and not yet picked up by a worker, per priority.",
        labels=["priority"],
    )
    running = GaugeMetricFamily(
        "fleetlm:queue_in_progress",
        "Requests a worker has taken from the queue and not finished, per priority.",
        labels=["priority"],
    )
    queued = dict.fromkeys(p.PRIORITIES, 0)
    taken = dict.fromkeys(p.PRIORITIES, 0)
    for i, (priority, _) in enumerate(queues):
        length, pending = results[2 * i], results[2 * i + 1]
        length = length if isinstance(length, int) else 0
        pending = pending["pending"] if isinstance(pending, dict) else 0
        queued[priority] += max(0, length - pending)
        taken[priority] += pending
    for priority in p.PRIORITIES:
        depth.add_metric([priority], queued[priority])
        running.add_metric([priority], taken[priority])

    heartbeat = GaugeMetricFamily(
        "fleetlm:worker_heartbeat_age_seconds",
        "Seconds since each live worker's last heartbeat.",
        labels=["worker"],
    )
    texts: list[str] = []
    base = 2 * len(queues)
    for j, w in enumerate(workers):
        pttl, text = results[base + 2 * j], results[base + 2 * j + 1]
        if isinstance(pttl, int) and pttl >= 0:
            age = max(0.0, settings.worker_dead_after_s - pttl / 1000)
            heartbeat.add_metric([w], age)
        texts.append(text if isinstance(text, str) else "")
    live = GaugeMetricFamily("fleetlm:workers_live", "Workers with a fresh heartbeat.")
    live.add_metric([], len(workers))

    oldest = await _oldest_unwritten_ms(redis)
    lag = GaugeMetricFamily(
        "fleetlm:metering_lag_seconds",
        "Age of the oldest usage record not yet written to Postgres (0: none).",
    )
    lag.add_metric([], 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000))
    return [depth, running, heartbeat, live, lag], list(zip(workers, texts))


def merge_worker_series(snapshots: Iterable[tuple[str, str]]) -> list[Metric]:
    """One family per name across workers, each sample labelled with its worker's id."""
    merged: dict[str, Metric] = {}
    for worker, text in snapshots:
        if not text:
            continue
        for family in text_string_to_metric_families(text):
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(family.name, family.documentation, family.type)
            for s in family.samples:
                out.add_sample(s.name, {**s.labels, "worker": worker}, s.value)
    return list(merged.values())


class _Static(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


@router.get(
    "/metrics",
    dependencies=[Depends(metrics_reader)],
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}}
    | errors(*AUTHED, 403),
)
async def metrics(state: State) -> Response:
    fleet, snapshots = await _fleet_families(state.redis, state.settings)
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_Static(fleet + merge_worker_series(snapshots)))
    body = api_series() + generate_latest(scrape)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def api_series() -> bytes:
    """This process's series, or every API process's (summed) when they share a multiprocess
    directory: prometheus_client reads PROMETHEUS_MULTIPROC_DIR when it is imported."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path)
    return generate_latest(registry)
