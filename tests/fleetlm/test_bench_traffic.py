# The benchmark traffic (fleetlm/bench/workloads.py) and the steady-state report and goodput
# search built on it (fleetlm/bench/latency.py, serve_bench.py): pure functions, no server.
from __future__ import annotations

import itertools
import math
import statistics

import pytest

from fleetlm.bench.latency import RequestRecord, Targets, summarize
from fleetlm.bench.loadgen import _error_code
from fleetlm.bench.serve_bench import sweep
from fleetlm.bench.workloads import SEED_TRAFFIC, describe, generate


@pytest.fixture(scope="module")
def many():
    return generate(SEED_TRAFFIC, vocab=128256, seed=1, num_requests=8000)


def test_seed_traffic_matches_the_brief(many):
    d = describe(many)
    # ≈ 2,000-token prompts of which ≈ 60 % shared, ≈ 400-token outputs, 70 % interactive.
    assert 1850 < d["mean_input"] < 2150
    assert 0.55 < d["shared_fraction"] < 0.65
    assert 370 < d["mean_output"] < 430
    assert 0.67 < d["interactive_fraction"] < 0.73
    long_docs = [r for r in many if len(r.prompt_ids) - r.num_shared_tokens >= 8000]
    assert 0.01 < len(long_docs) / len(many) < 0.03  # 2 % long documents of 8k–30k
    assert max(len(r.prompt_ids) for r in many) <= SEED_TRAFFIC.max_prompt_tokens
    # 8 shared 1,200-token system prompts: every prompt starts with one of them.
    heads = {tuple(r.prompt_ids[:1200]) for r in many}
    assert len(heads) == 8 and all(r.num_shared_tokens == 1200 for r in many)
    assert abs(SEED_TRAFFIC.mean_prompt_tokens - 2000) < 1e-6


def test_poisson_arrivals_and_replay():
    a = generate(SEED_TRAFFIC, vocab=32000, seed=3, rate=8.0, duration_s=120.0)
    gaps = [y.arrival_s - x.arrival_s for x, y in itertools.pairwise(a)]
    assert 850 < len(a) < 1070  # 960 expected
    assert all(0 <= r.arrival_s <= 120.0 for r in a)
    assert abs(statistics.fmean(gaps) - 1 / 8) < 0.015
    # The same rate again: identical requests (what --compare-engine replays).
    again = generate(SEED_TRAFFIC, vocab=32000, seed=3, rate=8.0, duration_s=120.0)
    assert [r.prompt_ids for r in again] == [r.prompt_ids for r in a]
    assert [r.arrival_s for r in again] == [r.arrival_s for r in a]
    # Same seed, another rate: requests of the same shapes in the same order, on another
    # schedule, sharing the system prompts but no user part (a sweep's later rates must not
    # find the earlier rates' prompts in the prefix cache).
    b = generate(SEED_TRAFFIC, vocab=32000, seed=3, rate=2.0, duration_s=30.0)
    assert [len(r.prompt_ids) for r in b] == [len(r.prompt_ids) for r in a[: len(b)]]
    assert [r.max_tokens for r in b] == [r.max_tokens for r in a[: len(b)]]
    assert b[1].arrival_s != a[1].arrival_s
    for x, y in zip(b, a):
        shared = x.num_shared_tokens
        assert x.prompt_ids[:shared] == y.prompt_ids[:shared]
        assert x.prompt_ids[shared:] != y.prompt_ids[shared:]


def test_clipping_to_a_small_context_and_excluded_ids():
    reqs = generate(
        SEED_TRAFFIC, vocab=4096, seed=0, num_requests=200, max_prompt_tokens=512,
        max_total_tokens=1024, excluded_ids=frozenset(range(4000, 4096)),
    )  # fmt: skip
    assert all(len(r.prompt_ids) <= 512 for r in reqs)
    assert all(len(r.prompt_ids) + r.max_tokens <= 1024 for r in reqs)
    assert all(0 <= t < 4000 for r in reqs for t in r.prompt_ids)
    assert all(r.arrival_s == 0.0 for r in reqs)


def _record(i, arrival, ttft, tpot, n_out, priority="interactive", prompt=1000, status="ok"):
    r = RequestRecord(i, priority, arrival, prompt, status=status)
    if status == "ok":
        r.first_token_s = arrival + ttft
        r.token_times = [r.first_token_s + k * tpot for k in range(n_out)]
        r.finish_s = r.token_times[-1]
        r.num_output = n_out
    return r


def test_report_counts_only_the_steady_window():
    targets = Targets()
    early = [_record(i, 1.0 + i * 0.1, ttft=5.0, tpot=0.2, n_out=10) for i in range(5)]
    steady = [_record(10 + i, 4.0 + i, ttft=0.1, tpot=0.02, n_out=51) for i in range(6)]
    batch = [_record(20, 5.0, ttft=2.0, tpot=0.03, n_out=11, priority="batch")]
    report = summarize(early + steady + batch, duration_s=10.0, warmup_fraction=0.3,
                       targets=targets)  # fmt: skip
    inter = report["interactive"]
    assert report["window_s"] == [3.0, 10.0]
    assert inter["num_requests"] == 6  # the warm-up arrivals are left out
    assert inter["ttft_s"]["p95"] == pytest.approx(0.1)
    assert inter["tpot_s"]["p50"] == pytest.approx(0.02)
    assert inter["itl_s"]["p95"] == pytest.approx(0.02)
    assert report["batch"]["ttft_s"]["p50"] == pytest.approx(2.0)  # batch TTFT is not a target
    assert report["meets_targets"]
    # Delivered tokens inside the window: the steady requests' tokens up to t = 10 s.
    delivered = sum(sum(1 for t in r.token_times if 3.0 <= t < 10.0) for r in steady + batch)
    assert report["all"]["output_tok_s"] == pytest.approx(delivered / 7.0)
    slow = [_record(30 + i, 4.0 + i, ttft=0.1, tpot=0.05, n_out=20) for i in range(6)]
    assert not summarize(slow, duration_s=10.0, warmup_fraction=0.3, targets=targets)[
        "meets_targets"
    ]
    failing = [*steady, _record(40, 5.0, 0, 0, 0, status="http_503")]
    report = summarize(failing, duration_s=10.0, warmup_fraction=0.3, targets=targets)
    assert report["all"]["errors"] == {"http_503": 1} and not report["meets_targets"]
    assert "predicted_ttft_s" not in report["all"]  # no forecast: not fleetlm


def test_admissions_forecast_is_reported_against_the_measured_first_token():
    # fleetlm's x-fleetlm-predicted-ttft: half the requests got their first token as forecast,
    # half twice as late.
    records = [_record(i, 4.0 + i * 0.5, ttft=0.4, tpot=0.02, n_out=11) for i in range(8)]
    for i, r in enumerate(records):
        r.predicted_ttft_s = 0.4 if i % 2 else 0.2
    report = summarize(records, duration_s=10.0, warmup_fraction=0.3, targets=Targets())
    every = report["all"]
    assert every["predicted_ttft_s"]["p50"] in (pytest.approx(0.2), pytest.approx(0.4))
    assert every["ttft_over_predicted"]["p95"] == pytest.approx(2.0)
    assert every["ttft_minus_predicted_s"]["p95"] == pytest.approx(0.2)


def test_the_slowest_first_tokens_are_listed_worst_first_with_where_their_time_went():
    records = [_record(i, 4.0 + i * 0.5, ttft=0.1 * (i + 1), tpot=0.02, n_out=5) for i in range(12)]
    records[6].server_queue_s, records[6].server_ttft_s = 0.2, 0.35
    worst = summarize(records, duration_s=10.0, warmup_fraction=0.3, targets=Targets())[
        "interactive"
    ]["slowest_first_tokens"]
    assert len(worst) == 8
    assert [w["ttft_s"] for w in worst] == sorted((w["ttft_s"] for w in worst), reverse=True)
    assert worst[0]["ttft_s"] == pytest.approx(1.2)
    by_arrival = {w["arrival_s"]: w for w in worst}
    assert by_arrival[7.0]["server_queue_s"] == 0.2  # records[6]
    assert by_arrival[7.0]["server_ttft_s"] == 0.35


def test_goodput_sweep_and_bisection():
    ran = []

    def run(rate):  # a system that meets the targets up to 6.3 req/s
        ran.append(rate)
        ok = rate <= 6.3
        return {"rate": rate, "meets_targets": ok,
                "report": {"all": {"output_tok_s": 100.0 * rate, "num_requests": 1, "num_ok": 1},
                           "interactive": {"ttft_s": {"p50": 0.1},
                                           "ttft_short_prompts_s": {"p95": 0.1},
                                           "tpot_s": {"p50": 0.01, "p95": 0.01}}}}  # fmt: skip

    result = sweep(run, [2.0, 4.0, 8.0, 12.0], bisect_rounds=3, log=lambda _: None)
    assert ran[:3] == [2.0, 4.0, 8.0]  # stops after the first miss
    assert ran[3:] == [6.0, 7.0, 6.5]  # bisects between 4 (pass) and 8 (miss)
    assert result["goodput_rate"] == 6.0
    assert result["goodput_output_tok_s"] == 600.0
    assert [r["rate"] for r in result["runs"]] == sorted(ran)
    ran.clear()
    every = sweep(run, [2.0, 8.0, 12.0], stop_after_failure=False, log=lambda _: None)
    assert ran == [2.0, 8.0, 12.0] and every["goodput_rate"] == 2.0
    none = sweep(lambda r: run(r + 10), [1.0], log=lambda _: None)
    assert none["goodput_rate"] == 0.0 and not math.isnan(none["goodput_output_tok_s"])


def test_a_refusal_is_reported_with_its_error_code():
    shed = b'{"error": {"message": "m", "type": "server_error", "code": "overloaded"}}'
    assert _error_code(shed) == ":overloaded"
    assert _error_code(b'{"error": {"message": "m", "code": null}}') == ""
    assert _error_code(b"<html>bad gateway</html>") == ""
    assert _error_code(b"[1, 2]") == ""


def test_percentiles_report_the_worst_value():
    from fleetlm.bench.latency import percentiles

    result = percentiles([0.3, 0.1, 2.5, 0.2])
    assert result["max"] == 2.5 and result["p50"] == 0.2 and result["mean"] == pytest.approx(0.775)
    assert math.isnan(percentiles([])["max"])


def test_an_overload_run_reports_refusals_and_the_tokens_that_went_to_completed_requests():
    steady = [_record(i, 4.0 + i, ttft=0.1, tpot=0.02, n_out=30) for i in range(4)]
    refused = [_record(10 + i, 5.0, 0, 0, 0, status="http_503:overloaded") for i in range(3)]
    refused[0].retry_after, refused[1].retry_after = "2", "0"  # the third sent none
    cut = _record(20, 6.0, 0, 0, 0, status="error:preempted")
    cut.num_output = 40  # generated and streamed, then failed: wasted
    report = summarize([*steady, *refused, cut], duration_s=10.0, warmup_fraction=0.3,
                       targets=Targets())  # fmt: skip
    every = report["all"]
    assert every["refused"] == 3 and every["refused_with_retry_after"] == 1
    assert every["completed_token_share"] == pytest.approx(120 / 160)
    assert report["interactive"]["ttft_s"]["max"] == pytest.approx(0.1)
