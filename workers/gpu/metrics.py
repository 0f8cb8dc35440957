# A worker's Prometheus series, with vLLM's names so existing dashboards and autoscalers work.
# The hot path only touches in-process objects: counters per step, and histogram values that
# are bucketed once per step (step_histogram.py). At most once per `snapshot_interval_s` the
# step thread sets the gauges and a publisher thread serialises the registry into Redis
# (fleetlm:worker:{id}:metrics, workers/gpu/metrics_publisher.py), where the API's /metrics picks it
# up; the same registry is served on the worker's own port if enabled.
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from workers.gpu.step_histogram import StepHistogram

disable_created_metrics()  # no *_created series: they double the exposition for nothing

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
PREEMPTION_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

# EngineStats totals → counter names; the engine keeps the running totals, we only report them.
_ENGINE_COUNTERS = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens."),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens."),
    "num_preemptions": ("vllm:num_preemptions", "Cumulative number of preemptions."),
    "spec_decode_num_draft_tokens": ("vllm:spec_decode_num_draft_tokens", "Draft tokens."),
    "spec_decode_num_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "Accepted."),
    "kernel_compiles": (
        "fleetlm:kernel_compiles",
        "Triton kernel compilations after start-up (each stalls a step).",
    ),
}


class _EngineTotals(Collector):
    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: Any = None

    def collect(self) -> Iterable[CounterMetricFamily]:
        for field, (name, doc) in _ENGINE_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(self.stats, field, 0)))
            yield family


class WorkerMetrics:
    def __init__(self, model_name: str, snapshot_interval_s: float = 1.0) -> None:
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        self.snapshot_interval_s = snapshot_interval_s
        labels = ["model_name"]
        self.running = Gauge(
            "vllm:num_requests_running", "Requests in model execution batches.", labels, registry=r
        ).labels(model_name)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", labels, registry=r
        ).labels(model_name)
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels,
            registry=r,
        ).labels(model_name)  # fmt: skip
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r
        ).labels(model_name)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", labels, registry=r
        ).labels(model_name)
        self.success = Counter(
            "vllm:request_success", "Successfully processed requests.",
            [*labels, "finished_reason"], registry=r,
        )  # fmt: skip
        # Histograms fed once per step (step_histogram.py): the hot path collects values.
        self.ttft = StepHistogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", model_name,
            TTFT_BUCKETS,
        )  # fmt: skip
        self.itl = StepHistogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", model_name,
            ITL_BUCKETS,
        )  # fmt: skip
        self.e2e = StepHistogram(
            "vllm:e2e_request_latency_seconds", "End to end request latency in seconds.",
            model_name, LATENCY_BUCKETS,
        )  # fmt: skip
        self.queue_time = StepHistogram(
            "vllm:request_queue_time_seconds", "Time spent queued (API admission to first "
            "schedule) in seconds.", model_name, LATENCY_BUCKETS,
        )  # fmt: skip
        for histogram in (self.ttft, self.itl, self.e2e, self.queue_time):
            r.register(histogram)
        self.busy_seconds = Counter(
            "fleetlm:engine_busy_seconds", "Seconds spent inside engine steps.", labels,
            registry=r,
        ).labels(model_name)  # fmt: skip
        self.busy_fraction = Gauge(
            "fleetlm:gpu_busy_fraction", "Share of wall time spent inside engine steps over the "
            "last snapshot interval.", labels, registry=r,
        ).labels(model_name)  # fmt: skip
        self.taken = Counter(
            "fleetlm:requests_taken", "Requests this worker took, by how: routed to it, from "
            "the shared queue, stolen from another worker's queue, reclaimed from a dead worker.",
            [*labels, "how"], registry=r,
        )  # fmt: skip
        self.taken_overdue = Counter(
            "fleetlm:requests_taken_overdue", "Interactive requests this worker took past its "
            "TPOT seats because they had waited in the queue past the admission bound.", labels,
            registry=r,
        ).labels(model_name)  # fmt: skip
        self.published_blocks = Gauge(
            "fleetlm:published_prefix_blocks", "Prefix-cache block hashes this worker publishes "
            "for routing.", labels, registry=r,
        ).labels(model_name)  # fmt: skip
        self.draining = Gauge(
            "fleetlm:worker_draining", "1 while the worker drains.", labels, registry=r
        ).labels(model_name)
        # Overload (docs/operations.md#faults-and-overload): how long the engine's waiting queue
        # has kept its oldest request, the running set the TPOT target allows, what this worker
        # may take now, and how often each finished request was preempted.
        self.waiting_age = Gauge(
            "fleetlm:engine_waiting_oldest_seconds", "Age of the oldest request in the engine's "
            "waiting queue (0: none waits).", labels, registry=r,
        ).labels(model_name)  # fmt: skip
        self.max_running = Gauge(
            "fleetlm:engine_max_running", "The running set the TPOT target allows (the step "
            "prices' prediction; max_num_seqs until they are fitted).", labels, registry=r,
        ).labels(model_name)  # fmt: skip
        self.startable = Gauge(
            "fleetlm:worker_startable_requests", "Queue entries the worker may take now: what "
            "its engine can start at the TPOT target with KV headroom.", labels, registry=r,
        ).labels(model_name)  # fmt: skip
        self.preemptions = Histogram(
            "fleetlm:request_preemptions", "Times a finished request was preempted (and "
            "recomputed).", labels, buckets=PREEMPTION_BUCKETS, registry=r,
        ).labels(model_name)  # fmt: skip
        self._budget: Any = None
        self._totals = _EngineTotals(model_name)
        r.register(self._totals)
        # (request id, choice index) → time of its latest token: each of n choices has its own
        # inter-token latency
        self._last_token: dict[tuple[str, int], float] = {}
        self._last_snapshot = 0.0
        self._busy_since_snapshot = 0.0

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    # -- hot path ------------------------------------------------------------------------

    def on_step(self, deltas: list, busy_s: float) -> None:
        self._busy_since_snapshot += busy_s
        self.busy_seconds.inc(busy_s)
        if not deltas:
            return
        now = time.time()
        generated = 0
        itl: list[float] = []
        ttft: list[float] = []
        last_token = self._last_token
        for d in deltas:
            n = len(d.new_token_ids)
            generated += n
            if n:
                key = (d.request_id, d.index)
                last = last_token.get(key)
                if last is not None:
                    itl.append((now - last) / n)
                elif d.first_token_time is not None and d.index == 0:
                    ttft.append(max(0.0, d.first_token_time - d.arrival_time))
                last_token[key] = now
            if d.finished:
                self._on_finished(d, now)
        self.itl.observe_many(itl)
        self.ttft.observe_many(ttft)
        if generated:
            self.generation_tokens.inc(generated)

    def _on_finished(self, d: Any, now: float) -> None:
        self.forget(d.request_id, len(d.finish_reasons or ()) or 1)
        self.prompt_tokens.inc(d.usage.prompt_tokens)
        self.success.labels(self.model_name, d.finish_reason or "error").inc()
        self.e2e.observe(max(0.0, (d.finish_time or now) - d.arrival_time))
        self.preemptions.observe(d.usage.preemptions)
        if d.first_scheduled_time is not None:
            self.queue_time.observe(max(0.0, d.first_scheduled_time - d.arrival_time))

    def on_budget(self, budget: Any) -> None:
        """The turn's intake budget (workers/gpu/intake_budget.py); gauges set at snapshot time."""
        self._budget = budget

    def forget(self, request_id: str, n: int = 1) -> None:
        for index in range(n):
            self._last_token.pop((request_id, index), None)

    # -- export --------------------------------------------------------------------------

    def snapshot_due(self, stats: Any, draining: bool) -> bool:
        """At most once per snapshot interval: set the gauges from `stats` and say a snapshot
        is due (workers/gpu/metrics_publisher.py serialises it off the step thread)."""
        now = time.monotonic()
        elapsed = now - self._last_snapshot
        if elapsed < self.snapshot_interval_s:
            return False
        if self._last_snapshot:
            self.busy_fraction.set(min(1.0, self._busy_since_snapshot / elapsed))
        self._last_snapshot, self._busy_since_snapshot = now, 0.0
        self.update(stats, draining)
        return True

    def update(self, stats: Any, draining: bool) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self.draining.set(1 if draining else 0)
        self._totals.stats = stats
        if self._budget is not None:
            self.waiting_age.set(self._budget.oldest_waiting_s)
            self.max_running.set(self._budget.max_running)
            self.startable.set(self._budget.room)
