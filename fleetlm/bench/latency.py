# Per-request latency records and the steady-state report built from them. The served benchmark
# (client-side chunk times) and the bare engine (engine delta times) fill the same record, so
# both go through one summary: TTFT, TPOT, ITL and end-to-end percentiles per class over the
# requests that arrived inside the measurement window, delivered tok/s inside that window,
# errors by kind, and whether the brief's targets hold.
from __future__ import annotations

import math
from dataclasses import dataclass, field

CLASSES = ("interactive", "batch")


@dataclass(frozen=True, slots=True)
class Targets:
    ttft_s: float = 0.8
    ttft_max_prompt_tokens: int = 4000  # the TTFT target applies to prompts shorter than this
    tpot_s: float = 0.040
    max_error_fraction: float = 0.01

    @classmethod
    def for_workload(cls, name: str = "seed") -> Targets:
        from fleetlm.capacity.workloads import get_workload

        w = get_workload(name)
        return cls(w.ttft_target_s, w.ttft_prompt_tokens, w.tpot_target_s)


@dataclass(slots=True)
class RequestRecord:
    index: int  # position in the traffic (the same request in the served and engine runs)
    priority: str
    arrival_s: float  # scheduled arrival, seconds from the run's start
    num_prompt: int
    # "ok", or what went wrong: "http_503:queue_full", "error:<code>", "timeout", ...
    status: str = "pending"
    first_token_s: float | None = None
    finish_s: float | None = None
    num_output: int = 0
    num_cached: int = 0
    token_times: list[float] = field(default_factory=list)  # one per chunk / engine delta
    # Served runs against a launched fleetlm: the request's id and its usage row's timings,
    # measured by the server from the API's enqueue (queue: until the engine first scheduled
    # it; ttft: until the engine had its first token on the host). Client TTFT minus server
    # TTFT is the way in to the API's enqueue and the way out (worker publish, relay, client).
    request_id: str | None = None
    server_queue_s: float | None = None
    server_ttft_s: float | None = None
    # ... and, from the admitted log line, its time before the queue by stage (ms; launcher.py)
    server_admission_ms: dict[str, float] | None = None
    # What fleetlm's admission forecast for its first token (x-fleetlm-predicted-ttft)
    predicted_ttft_s: float | None = None
    retry_after: str | None = None  # the Retry-After header of a refusal, as sent

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p95": math.nan, "p99": math.nan, "max": math.nan}
    s = sorted(values)

    def pick(q: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]

    # max: bounds such as "no admitted request waited past ..." are about the worst one
    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "max": s[-1],
            "mean": sum(s) / len(s)}  # fmt: skip


def _tpot(r: RequestRecord) -> float | None:
    if r.first_token_s is None or r.finish_s is None or r.num_output < 2:
        return None
    return (r.finish_s - r.first_token_s) / (r.num_output - 1)


def _delivered_tokens(records: list[RequestRecord], t0: float, t1: float) -> float:
    """Output tokens delivered inside [t0, t1): each chunk carries its request's tokens spread
    evenly over its chunks (a served chunk has no token count of its own)."""
    total = 0.0
    for r in records:
        if not r.token_times or r.num_output == 0:
            continue
        per_chunk = r.num_output / len(r.token_times)
        total += per_chunk * sum(1 for t in r.token_times if t0 <= t < t1)
    return total


def summarize_class(records: list[RequestRecord], t0: float, t1: float, targets: Targets) -> dict:
    done = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.status] = errors.get(r.status, 0) + 1
    ttft = [r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None]
    ttft_short = [
        r.first_token_s - r.arrival_s
        for r in done
        if r.first_token_s is not None and r.num_prompt < targets.ttft_max_prompt_tokens
    ]
    tpot = [x for x in map(_tpot, done) if x is not None]
    itl = [b - a for r in done for a, b in zip(r.token_times, r.token_times[1:])]
    e2e = [r.finish_s - r.arrival_s for r in done if r.finish_s is not None]
    refused = [r for r in records if r.status.startswith("http_503")]
    span = t1 - t0
    out_tokens = _delivered_tokens(records, t0, t1)
    in_tokens = sum(r.num_prompt for r in done)
    return (
        {
            "num_requests": len(records),
            "num_ok": len(done),
            "errors": errors,
            "ttft_s": percentiles(ttft),
            "ttft_short_prompts_s": percentiles(ttft_short),
            "tpot_s": percentiles(tpot),
            "itl_s": percentiles(itl),
            "e2e_s": percentiles(e2e),
            "output_tok_s": out_tokens / span if span > 0 else math.nan,
            # Prompt tokens of the window's requests per second of window (their arrival rate).
            "input_tok_s": in_tokens / span if span > 0 else math.nan,
            "mean_output_tokens": sum(r.num_output for r in done) / max(len(done), 1),
            # Streamed chunks per generated token: ~1 when the server streams every token.
            "chunks_per_token": sum(len(r.token_times) for r in done)
            / max(sum(r.num_output for r in done), 1),
            "cached_fraction": sum(r.num_cached for r in done) / max(in_tokens, 1),
            # Of the tokens generated for the window's requests, the share that went to requests
            # that completed (a stream that failed or was cut off wasted the rest).
            "completed_token_share": sum(r.num_output for r in done)
            / max(sum(r.num_output for r in records), 1),
            # Refusals (HTTP 503) and how many of them said when to come back.
            "refused": len(refused),
            "refused_with_retry_after": sum(_positive_int(r.retry_after) for r in refused),
        }
        | _server_side(done, targets)
        | _forecast(done)
        | {"slowest_first_tokens": slowest_first_tokens(done)}
    )


def slowest_first_tokens(done: list[RequestRecord], n: int = 8) -> list[dict]:
    """The worst first tokens, each with where its time went (the server's queue and TTFT when
    its usage row was read, admission's forecast): an overload bound is about these."""
    timed = [r for r in done if r.first_token_s is not None]
    timed.sort(key=lambda r: r.first_token_s - r.arrival_s, reverse=True)
    return [
        {
            "arrival_s": round(r.arrival_s, 3),
            "prompt_tokens": r.num_prompt,
            "cached_tokens": r.num_cached,
            "ttft_s": round(r.first_token_s - r.arrival_s, 3),
            "predicted_ttft_s": r.predicted_ttft_s,
            "server_queue_s": r.server_queue_s,
            "server_ttft_s": r.server_ttft_s,
            "server_admission_ms": r.server_admission_ms,
        }
        for r in timed[:n]
    ]


def _positive_int(header: str | None) -> bool:
    try:
        return header is not None and int(header) >= 1
    except ValueError:
        return False


def _forecast(done: list[RequestRecord]) -> dict:
    """Admission's forecast against the first token the client measured (fleetlm only)."""
    pairs = [
        (r.predicted_ttft_s, r.first_token_s - r.arrival_s)
        for r in done
        if r.predicted_ttft_s is not None and r.first_token_s is not None
    ]
    if not pairs:
        return {}
    return {
        "predicted_ttft_s": percentiles([p for p, _ in pairs]),
        "ttft_minus_predicted_s": percentiles([m - p for p, m in pairs]),
        "ttft_over_predicted": percentiles([m / max(p, 1e-3) for p, m in pairs]),
    }


def _server_side(done: list[RequestRecord], targets: Targets) -> dict:
    """Where a served short prompt's TTFT went, when the server's usage rows were read."""
    short = [
        r
        for r in done
        if r.server_ttft_s is not None
        and r.first_token_s is not None
        and r.num_prompt < targets.ttft_max_prompt_tokens
    ]
    if not short:
        return {}
    return {
        "server_queue_s": percentiles([r.server_queue_s for r in short if r.server_queue_s]),
        "server_ttft_s": percentiles([r.server_ttft_s for r in short]),
        "client_minus_server_ttft_s": percentiles(
            [r.first_token_s - r.arrival_s - r.server_ttft_s for r in short]
        ),
    }


def summarize(
    records: list[RequestRecord],
    *,
    duration_s: float,
    warmup_fraction: float,
    targets: Targets,
) -> dict:
    """The steady-state report: requests that arrived in [warmup × duration, duration)."""
    t0, t1 = warmup_fraction * duration_s, duration_s
    window = [r for r in records if t0 <= r.arrival_s < t1]
    report = {"window_s": [t0, t1], "all": summarize_class(window, t0, t1, targets)}
    for cls in CLASSES:
        report[cls] = summarize_class([r for r in window if r.priority == cls], t0, t1, targets)
    report["all"]["total_tok_s"] = report["all"]["output_tok_s"] + report["all"]["input_tok_s"]
    report["meets_targets"] = meets_targets(report, targets)
    return report


def meets_targets(report: dict, targets: Targets) -> bool:
    """Interactive requests meet TTFT p95 (short prompts) and TPOT p95; few errors overall."""
    inter, every = report["interactive"], report["all"]
    if every["num_requests"] == 0 or inter["num_ok"] == 0:
        return False
    failed = every["num_requests"] - every["num_ok"]
    if failed > targets.max_error_fraction * every["num_requests"]:
        return False
    ttft = inter["ttft_short_prompts_s"]["p95"]
    tpot = inter["tpot_s"]["p95"]
    return ttft < targets.ttft_s and (math.isnan(tpot) or tpot < targets.tpot_s)
