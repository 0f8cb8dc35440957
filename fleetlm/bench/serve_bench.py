# `fleetlm bench serve`: sustained open-loop traffic at a list of rates, the steady-state report
# per rate (fleetlm.bench.latency), and goodput — the highest rate whose steady state meets the
# targets — by a sweep and a bisection. Two backends run the identical requests: an HTTP server
# (ours or any OpenAI-compatible one) and the bare engine in this process, so served ÷ engine
# can be read per rate.
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.runner.step_trace import summarize_steps
from fleetlm.bench.fleet_stats import FleetStats, fleet_delta
from fleetlm.bench.fleet_stats import one_line as fleet_line
from fleetlm.bench.latency import RequestRecord, Targets, summarize
from fleetlm.bench.loadgen import Target, run_schedule
from fleetlm.bench.workloads import TrafficSpec, describe, generate


@dataclass(slots=True)
class TrafficPlan:
    spec: TrafficSpec
    vocab: int
    seed: int
    duration_s: float
    warmup_fraction: float
    max_prompt_tokens: int | None = None
    max_total_tokens: int | None = None
    excluded_ids: frozenset[int] = frozenset()

    def requests(self, rate: float, *, seed: int | None = None, duration_s: float | None = None):
        return generate(
            self.spec, vocab=self.vocab, seed=self.seed if seed is None else seed, rate=rate,
            duration_s=self.duration_s if duration_s is None else duration_s,
            max_prompt_tokens=self.max_prompt_tokens, max_total_tokens=self.max_total_tokens,
            excluded_ids=self.excluded_ids,
        )  # fmt: skip


# A backend runs requests and returns (records, start time as time.time(), step columns | None).
RunResult = tuple[list[RequestRecord], float, dict | None]


class HttpBackend:
    name = "served"

    def __init__(
        self,
        target: Target,
        *,
        num_processes: int,
        drain_timeout_s: float,
        trace_reader: Callable[[], list[dict]] | None = None,
        fleet: FleetStats | None = None,
        usage_reader: Callable[[list[str]], dict[str, tuple]] | None = None,
        admission_reader: Callable[[list[str]], dict[str, dict]] | None = None,
        stall_reader: Callable[[float], dict] | None = None,
        progress: bool = True,
    ) -> None:
        self.target = target
        self.num_processes = num_processes
        self.drain_timeout_s = drain_timeout_s
        self.trace_reader = trace_reader  # the launched server's worker step traces
        self.fleet = fleet  # fleetlm's per-worker counters (an admin key)
        self.last_fleet: dict | None = None  # the last run's per-worker figures
        # request id → (queue_ms, ttft_ms) from the server's usage rows (a launched server)
        self.usage_reader = usage_reader
        self.admission_reader = admission_reader  # the launched server's admitted log lines
        self.stall_reader = stall_reader  # its API processes' event-loop stalls since a time
        self.last_stalls: dict | None = None
        self.progress = progress

    def run(self, requests, label: str) -> RunResult:
        before = self.fleet.read() if self.fleet is not None else None
        bar = ProgressBar(label, len(requests)) if self.progress else None
        since = time.time()
        records, t0 = run_schedule(
            self.target, requests, num_processes=self.num_processes,
            drain_timeout_s=self.drain_timeout_s, progress=bar.update if bar else None,
        )  # fmt: skip
        if bar:
            bar.close()
        steps = None
        if self.trace_reader is not None:
            time.sleep(1.5)  # the workers append their rows about once a second
            traces = self.trace_reader()
            if traces:
                steps = traces[0] if len(traces) == 1 else _concat(traces)
        if self.fleet is not None:
            time.sleep(1.0)  # an idle worker rewrites its stats at least twice a second
            self.last_fleet = fleet_delta(before, self.fleet.read())
        if self.usage_reader is not None:
            timings = self.usage_reader([r.request_id for r in records if r.request_id])
            for r in records:
                queue_ms, ttft_ms = timings.get(r.request_id, (None, None))
                r.server_queue_s = queue_ms / 1000 if queue_ms is not None else None
                r.server_ttft_s = ttft_ms / 1000 if ttft_ms is not None else None
        if self.admission_reader is not None:
            stages = self.admission_reader([r.request_id for r in records if r.request_id])
            for r in records:
                r.server_admission_ms = stages.get(r.request_id)
        if self.stall_reader is not None:
            self.last_stalls = self.stall_reader(since)
        return records, t0, steps


class EngineBackend:
    name = "engine"

    def __init__(self, engine, *, progress: bool = True) -> None:
        self.engine = engine
        self.progress = progress

    def run(self, requests, label: str) -> RunResult:
        from fleetlm.bench.engine_bench import run_workload

        if self.progress:
            print(f"{label}: {len(requests)} requests through the bare engine", flush=True)
        result = run_workload(self.engine, requests, keep_records=True, timeout_s=3600)
        return result["records"], result["start_time"], result["step_columns"]


def _concat(traces: list[dict]) -> dict:
    keys = set.intersection(*(set(t) for t in traces))
    merged = {k: np.concatenate([t[k] for t in traces]) for k in keys}
    order = np.argsort(merged["start"], kind="stable")
    return {k: v[order] for k, v in merged.items()}


class ProgressBar:
    def __init__(self, label: str, total: int, width: int = 30) -> None:
        import sys

        self.label, self.total, self.width = label, total, width
        self.stream = sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.last_print = 0.0

    def update(self, sent: int, done: int, failed: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last_print < (0.5 if self.tty else 10.0):
            return
        self.last_print = now
        filled = int(self.width * done / max(total, 1))
        bar = "#" * filled + "." * (self.width - filled)
        line = (
            f"{self.label} [{bar}] sent {sent}/{total}, done {done}, failed {failed}, "
            f"{now - self.started:.0f}s"
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n",
              file=self.stream, flush=True)  # fmt: skip

    def close(self) -> None:
        if self.tty:
            print(file=self.stream, flush=True)


def run_rate(backend, plan: TrafficPlan, rate: float, targets: Targets) -> dict:
    requests = plan.requests(rate)
    started = time.monotonic()
    records, t0, steps = backend.run(requests, f"{backend.name} {rate:g} req/s")
    report = summarize(
        records, duration_s=plan.duration_s, warmup_fraction=plan.warmup_fraction, targets=targets
    )
    run = {
        "rate": rate,
        "workload": describe(requests),
        "report": report,
        "wall_s": time.monotonic() - started,
        "meets_targets": report["meets_targets"],
    }
    workers = getattr(backend, "last_fleet", None)
    if workers is not None:
        run["fleet"] = workers
    stalls = getattr(backend, "last_stalls", None)
    if stalls is not None:
        run["api_stalls"] = stalls
    if steps is not None:
        w0, w1 = report["window_s"]
        keep = (steps["start"] >= t0 + w0) & (steps["start"] < t0 + w1)
        run["steps"] = summarize_steps({k: v[keep] for k, v in steps.items()})
    return run


def sweep(
    run: Callable[[float], dict],
    rates: list[float],
    *,
    bisect_rounds: int = 0,
    stop_after_failure: bool = True,
    resolution: float = 0.25,
    log: Callable[[str], None] = print,
    on_run: Callable[[dict], None] | None = None,
) -> dict:
    """Runs the rates in order (stopping after the first that misses the targets, unless told
    otherwise), then bisects between the highest passing and the lowest failing rate."""
    runs: dict[float, dict] = {}

    def measure(rate: float) -> dict:
        runs[rate] = run(rate)
        log(one_line(runs[rate]))
        if on_run is not None:
            on_run(runs[rate])
        return runs[rate]

    for rate in rates:
        passed = measure(rate)["meets_targets"]
        if stop_after_failure and not passed:
            break
    for _ in range(bisect_rounds):
        passing = [r for r, x in runs.items() if x["meets_targets"]]
        lo = max(passing, default=0.0)
        above = [r for r, x in runs.items() if not x["meets_targets"] and r > lo]
        if not above:
            break
        hi = min(above)
        mid = round((lo + hi) / 2 / resolution) * resolution
        if mid <= lo or mid >= hi or mid in runs:
            break
        measure(mid)
    ordered = [runs[r] for r in sorted(runs)]
    passing = [x for x in ordered if x["meets_targets"]]
    best = passing[-1] if passing else None
    return {
        "runs": ordered,
        "goodput_rate": best["rate"] if best else 0.0,
        "goodput_output_tok_s": best["report"]["all"]["output_tok_s"] if best else 0.0,
    }


def one_line(run: dict) -> str:
    rep = run["report"]
    inter, every = rep["interactive"], rep["all"]
    failed = every["num_requests"] - every["num_ok"]
    step = run.get("steps", {})
    step_txt = ""
    if step.get("steps"):
        step_txt = (
            f", step p50 {step['wall_ms']['p50']:.1f} ms, running p50 "
            f"{step['num_running']['p50']:.0f}"
        )
        compiles = step.get("kernel_compiles", {}).get("total", 0)
        if compiles:
            step_txt += f", {compiles:.0f} kernel compiles mid-run"
    line = (
        f"  {run['rate']:g} req/s: {every['output_tok_s']:.0f} out tok/s, interactive TTFT "
        f"p50/p95 {_s(inter['ttft_s']['p50'])}/{_s(inter['ttft_short_prompts_s']['p95'])} s, "
        f"TPOT p50/p95 {_ms(inter['tpot_s']['p50'])}/{_ms(inter['tpot_s']['p95'])} ms, "
        f"{failed} failed{step_txt} → {'meets' if run['meets_targets'] else 'misses'} targets"
    )
    if "server_ttft_s" in inter:
        q, t, gap = (
            inter["server_queue_s"],
            inter["server_ttft_s"],
            inter["client_minus_server_ttft_s"],
        )
        line += (
            f"\n    server side (short prompts, p50/p95): queue {_s(q['p50'])}/{_s(q['p95'])} s, "
            f"TTFT {_s(t['p50'])}/{_s(t['p95'])} s; client − server TTFT "
            f"{_s(gap['p50'])}/{_s(gap['p95'])} s"
        )
    if every.get("refused") or step.get("gpu_busy_fraction") is not None:
        # What an overload run is judged by: the worst admitted first token against the bound,
        # the tokens that went to requests that completed, refusals that say when to come back.
        line += (
            f"\n    interactive TTFT max {_s(inter['ttft_s']['max'])} s; "
            f"{every['completed_token_share']:.1%} of generated tokens to completed requests; "
            f"refused {every['refused']} ({every['refused_with_retry_after']} with Retry-After)"
        )
        if step.get("gpu_busy_fraction") is not None:
            line += f"; GPU busy {step['gpu_busy_fraction']:.1%}"
        worst = inter.get("slowest_first_tokens", [])[:3]
        if worst:
            line += "\n    slowest interactive first tokens (TTFT: server queue / server TTFT / "
            line += "forecast, s): " + ", ".join(_slow(w) for w in worst)
    stalls = run.get("api_stalls")
    if stalls and stalls["logged"]:
        line += (
            f"\n    API event loop stalled ({stalls['logged']} logged): worst "
            f"{stalls['worst_ms']:.0f} ms ({stalls['worst_gc_ms']:.0f} ms collecting garbage) "
            f"at {stalls['worst_where']}"
        )
    fleet = fleet_line(run.get("fleet"))
    return f"{line}\n{fleet}" if fleet else line


def _slow(w: dict) -> str:
    parts = (w["server_queue_s"], w["server_ttft_s"], w["predicted_ttft_s"])
    detail = " / ".join("-" if x is None else f"{x:.2f}" for x in parts)
    admission = w.get("server_admission_ms")
    if admission:  # its time before the queue: in the API since its enqueue stamp
        detail += f", admitted after {admission['admit_ms'] / 1000:.2f}"
    return f"{w['ttft_s']:.2f} ({detail}, {w['prompt_tokens']} tok)"


def _s(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.3f}"


def _ms(x: float) -> str:
    return "nan" if math.isnan(x) else f"{1e3 * x:.1f}"


def compare(served: dict, engine: dict) -> dict:
    """served ÷ engine at the rates both ran, and of their goodputs."""
    by_rate = {r["rate"]: r for r in engine["runs"]}
    rows = []
    for s in served["runs"]:
        e = by_rate.get(s["rate"])
        if e is None:
            continue
        si, ei = s["report"]["interactive"], e["report"]["interactive"]
        rows.append({
            "rate": s["rate"],
            "tpot_p50_ratio": _ratio(si["tpot_s"]["p50"], ei["tpot_s"]["p50"]),
            "tpot_p95_ratio": _ratio(si["tpot_s"]["p95"], ei["tpot_s"]["p95"]),
            "ttft_p95_ratio": _ratio(
                si["ttft_short_prompts_s"]["p95"], ei["ttft_short_prompts_s"]["p95"]
            ),
            "output_tok_s_ratio": _ratio(
                s["report"]["all"]["output_tok_s"], e["report"]["all"]["output_tok_s"]
            ),
        })  # fmt: skip
    return {
        "per_rate": rows,
        "goodput_ratio": _ratio(served["goodput_rate"], engine["goodput_rate"]),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan
