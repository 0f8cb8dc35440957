# Overload on a worker with a big model's shape: every step also waits what a 70B's would cost
# relative to its decodes (Settings.emulate_step_cost_s: a long prefill, 0.5 ms per prompt
# token, and a decode turn that grows with the batch), long prompts, and a KV pool that holds
# only a few of them at once. Offered 3× what it sustains, 30 % of it flex: admission, not
# preemption, holds the line. The worker takes only what its KV headroom lets it start, the rest
# waits in Redis where admission counts it and refuses (503 with Retry-After, reason `kv`) what
# cannot start in time. Flex starts only with the KV that interactive arrivals are forecast to
# need left free, so it waits while interactive demand holds the worker and is rarely
# preempted; nothing fails, and the admitted interactive requests get their first token within
# the limit whatever the flex traffic does. Each admitted
# request carries admission's forecast of its first token (x-fleetlm-predicted-ttft), which is
# held against what it measured.
from __future__ import annotations

import statistics

import pytest

from tests.faults.conftest import completion_body, fault_server
from tests.faults.test_overload import (
    DEFAULT_ENV,
    DEFAULTS,
    FIRST_TOKEN_LIMIT_S,
    MODEL,
    WorkerMonitor,
    check_refusals_and_ends,
    closed_loop,
    open_loop,
    steady_rate,
)
from tests.waiting import wait_until

# Alone, after the parallel part of make test: capacity is measured, then offered 3x.
pytestmark = [pytest.mark.timeout(420), pytest.mark.serial]

PROMPT_TOKENS, MAX_TOKENS = 300, 40  # 340 tokens: 22 blocks of 16
NUM_KV_BLOCKS = 100  # four such requests, three with the 10 % headroom
BIG_MODEL_ENV = DEFAULT_ENV | {
    "FLEETLM_EMULATE_STEP_COST_S": "[0.02, 0.001, 0.0005]",
    "FLEETLM_NUM_KV_BLOCKS": str(NUM_KV_BLOCKS),
}
WARMUP_S, CAPACITY_S, OVERLOAD_S = 10.0, 20.0, 20.0


def long_body(i: int) -> dict:
    """Distinct long prompts (no prefix-cache hits between them); every third one flex."""
    start = 100 + (i * 7) % 3000
    prompt = [start + j % 500 for j in range(PROMPT_TOKENS)]
    tier = {"service_tier": "flex"} if i % 3 == 2 else {}
    return completion_body(MAX_TOKENS, model=MODEL, prompt=prompt, **tier)


def series(server, name: str) -> float | None:
    """The sum of the /metrics lines that start with `name`; None when there is none."""
    import httpx

    r = httpx.get(
        server.base_url + "/metrics",
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=30,
    )
    values = [float(ln.rsplit(" ", 1)[1]) for ln in r.text.splitlines() if ln.startswith(name)]
    return sum(values) if values else None


def test_a_big_models_kv_pool_is_held_by_admission_not_preemption(tmp_path_factory):
    srv = fault_server(tmp_path_factory, "overload-big", workers=1, **BIG_MODEL_ENV)

    def idle():
        (w,) = srv.workers_stats()
        return w if "decode_token_s" in w and w["num_running"] == w["num_waiting"] == 0 else None

    try:
        closed_loop(srv, 4, WARMUP_S, long_body)
        wait_until(idle, 60, "the worker's step prices and an idle worker", 0.2)
        capacity = closed_loop(srv, 8, CAPACITY_S, long_body)
        served = [o for o in capacity if o.finish_reason == "length"]
        rate = steady_rate(capacity, CAPACITY_S)
        wait_until(idle, 60, "the worker to be idle", 0.2)
        preempted_before = series(srv, "vllm:num_preemptions_total") or 0.0
        monitor = WorkerMonitor(srv)
        overload = open_loop(srv, 3 * rate, OVERLOAD_S, long_body)
        samples = monitor.join()
        wait_until(idle, 60, "the worker to be idle", 0.2)
        admitted = [o for o in overload if o.status == 200]
        rows = srv.usage_rows([o.request_id for o in admitted], timeout_s=60)
        preempted = (series(srv, "vllm:num_preemptions_total") or 0.0) - preempted_before
        kv_refusals = (
            series(srv, 'fleetlm:overload_refusals_total{priority="interactive",reason="kv"') or 0.0
        )
        forecasts = series(srv, 'fleetlm:predicted_ttft_seconds_count{priority="interactive"')
        forecasts = forecasts or 0.0
        preemption_counts = series(srv, "fleetlm:request_preemptions_count") or 0.0
        waiting_age = series(srv, "fleetlm:engine_waiting_oldest_seconds")
    finally:
        assert srv.stop() == 0, srv.log()

    refused = [o for o in overload if o.status == 503]
    flex_ids = {o.request_id for o in admitted if o.flex}
    interactive = sorted(o.first_token_s for o in admitted if not o.flex)
    median = statistics.median(o.e2e_s for o in served)
    running = max(s["num_running"] for s in samples)
    forecast = sorted((o.predicted_ttft_s, o.first_token_s) for o in admitted if not o.flex)
    ratios = sorted(measured / max(predicted, 0.1) for predicted, measured in forecast)
    kv_max = max(s["kv_cache_usage"] for s in samples)
    flex_first = sorted(round(o.first_token_s, 1) for o in admitted if o.flex)
    print(
        f"big model: capacity {rate:.2f} req/s (median {median:.1f} s); at 3x: {len(refused)} "
        f"of {len(overload)} refused ({kv_refusals:.0f} interactive for kv), {len(admitted)} "
        f"admitted ({len(flex_ids)} flex), interactive first token max {interactive[-1]:.1f} s; "
        f"running max {running}, kv usage max {kv_max:.2f}, preemptions {preempted:.0f}; "
        f"measured / predicted first token: median {statistics.median(ratios):.2f}, max "
        f"{ratios[-1]:.2f}; flex first tokens {flex_first}; "
        f"predicted, measured: {[(p, round(m, 2)) for p, m in forecast]}"
    )
    # Refusals with Retry-After; everything admitted completes: nothing fails for lack of KV.
    check_refusals_and_ends(capacity, overload, rows)
    # Flex requests yield to interactive ones, rarely by preemption; interactive ones never. (A
    # flex request is started, or re-admitted after a preemption, only with the KV interactive
    # arrivals are forecast to need left free: before that, one was preempted 11 times.)
    assert all(r.preemptions == 0 for r in rows if r.request_id not in flex_ids)
    assert preempted <= max(2, len(flex_ids) // 3)
    assert all(r.preemptions <= 2 for r in rows)
    # Interactive requests got their first token in time, flex traffic notwithstanding.
    assert interactive and interactive[-1] <= FIRST_TOKEN_LIMIT_S
    # What admission forecast (x-fleetlm-predicted-ttft: the prefill ahead in chunks, each turn
    # carrying the running decodes, a seat's wait) was within the bound for every admitted
    # request and is what they waited, within generous margins for a busy 2-core machine: no
    # admitted request waited much past its forecast, and the forecast is not off by a factor.
    bound = DEFAULTS["max_queue_wait_s"].default
    assert all(predicted is not None and predicted <= bound for predicted, _ in forecast)
    # (Per request, a stray one delayed by the machine's other jobs may pass that margin: nine in
    # ten must hold it.)
    within = sum(measured <= 2 * predicted + 4.0 for predicted, measured in forecast)
    assert within >= 0.9 * len(forecast), (within, len(forecast))
    assert 0.25 <= statistics.median(ratios) <= 4.0
    # /metrics: a forecast per interactive request admitted or refused, the preemptions of each
    # finished request, the age of the engine's oldest waiting request.
    assert forecasts >= sum(not o.flex for o in overload)
    assert preemption_counts >= len(rows)
    assert waiting_age is not None
    # KV, not the TPOT target, is what held the line: the worker's intake was bound by its KV
    # headroom, and admission refused interactive requests for it.
    assert sum(s["limited_by"] == "kv" for s in samples) >= 0.5 * len(samples)
    assert kv_refusals > 0
