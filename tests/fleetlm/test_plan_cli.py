import json

import pytest

from fleetlm import cli

BRIEF = ["plan", "--model", "llama-3.1-70b", "--weights-dtype", "fp8", "--kv-dtype", "bf16"]
BRIEF += ["--gpus", "4xH100", "--workload", "seed"]


@pytest.fixture(autouse=True)
def only_plan(monkeypatch):
    # The parser imports every subcommand's module; keep these tests to ours so a sibling
    # subcommand that is mid-edit (or needs torch) cannot fail them.
    assert cli.SUBCOMMANDS["plan"] == "fleetlm.plan_cmd"
    monkeypatch.setattr(cli, "SUBCOMMANDS", {"plan": "fleetlm.plan_cmd"})


def run_json(capsys, *extra):
    assert cli.main([*BRIEF, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_carries_the_brief_figures(capsys):
    out = run_json(capsys, "--price-per-gpu-hour", "2.5", "--utilisation", "0.6")
    mem = out["memory"]
    assert mem["kv_bytes_per_token"] == 327_680
    assert abs(mem["weight_bytes"] - 70e9) < 0.05 * 70e9
    assert abs(mem["kv_pool_bytes"] - 206e9) < 0.05 * 206e9
    assert abs(mem["kv_tokens"] - 640_000) < 0.05 * 640_000
    assert abs(mem["conversations"] - 250) < 0.05 * 250
    assert out["reserve"]["rule"].startswith("10% of each GPU + 3 GB per GPU")
    assert out["gpu"]["name"] == "H100-SXM" and out["gpu"]["count"] == 4
    assert "nvidia.com" in out["gpu"]["source"]
    assert out["decode"]["batch"] == mem["conversations"]
    assert out["decode"]["floor"]["bound"] == "bandwidth"
    assert out["prefill"]["prompt_tokens"] == 4000
    assert out["prefill"]["ttft_s"] < 0.8
    assert out["serving"]["feasible"] and out["serving"]["tpot_s"] <= 0.040
    econ = out["economics"]
    assert econ["prices"]["gpu_hour"] == 2.5 and econ["prices"]["utilisation"] == 0.6
    assert econ["cost_per_m_output"] > 0 and econ["replicas_for_target"] >= 1


def test_json_fp8_kv_doubles_tokens(capsys):
    bf16 = run_json(capsys)["memory"]["kv_tokens"]
    fp8 = run_json(capsys, "--kv-dtype", "fp8")["memory"]["kv_tokens"]
    assert abs(fp8 - 2 * bf16) <= 1


def test_measured_bandwidth_and_overrides(capsys):
    base = run_json(capsys)
    slow = run_json(capsys, "--bandwidth", "2.0", "--batch", "64", "--context", "4096")
    assert slow["replica"]["bandwidth_bytes_s"] == pytest.approx(4 * 2.0e12)
    assert "measured" in slow["gpu"]["source"]
    assert slow["decode"]["batch"] == 64 and slow["decode"]["context_tokens"] == 4096
    assert slow["serving"]["output_tok_s"] < base["serving"]["output_tok_s"]
    roomy = run_json(capsys, "--memory-utilisation", "0.95", "--runtime-reserve-gb", "1")
    assert roomy["memory"]["kv_tokens"] > base["memory"]["kv_tokens"]


def test_infeasible_targets_still_print_valid_json(capsys):
    out = run_json(capsys, "--tpot-ms", "1")
    assert out["serving"]["feasible"] is False
    assert out["serving"]["tpot_s"] is None  # no Infinity in JSON
    assert out["economics"]["cost_per_m_output"] is None


def test_table_renders(capsys):
    assert cli.main(BRIEF) == 0
    text = capsys.readouterr().out
    for needle in (
        "4xH100-SXM",
        "source: NVIDIA H100",
        "MEMORY",
        "327,680 B",
        "320 KiB",
        "10% of each GPU + 3 GB per GPU",
        "DECODE",
        "bandwidth-bound",
        "PREFILL",
        "compute-bound",
        "SERVING FLOOR",
        "limited by KV capacity",
        "FORECAST",
        "TPOT mean / p95",
        "COST",
        "cost per 1M output tokens",
        "hosted API cheaper below",
    ):
        assert needle in text, needle


def test_json_carries_the_floor_and_the_forecast(capsys):
    out = run_json(capsys)
    floor, f = out["serving"], out["forecast"]
    assert 0 < f["output_tok_s"] < floor["output_tok_s"]
    assert f["output_tok_s"] == pytest.approx(f["rate_req_s"] * 400)
    assert f["limited_by"] and f["best"]["tpot_p95_s"] <= 0.040
    assert f["best"]["ttft_p95_s"] <= 0.8 and 0 < f["best"]["prefill_share"] < 1
    assert f["profile"]["decode_efficiency"] == 0.75 and not f["profile"]["shared_prefix_decode"]
    assert out["economics"]["output_tok_s_per_replica"] == pytest.approx(f["output_tok_s"])


def test_engine_flags_move_the_forecast_not_the_floor(capsys):
    base = run_json(capsys)
    slow = run_json(capsys, "--decode-efficiency", "0.5", "--prefill-efficiency", "0.5")
    shared = run_json(capsys, "--shared-prefix-decode")
    paced = run_json(capsys, "--paced-long-prompts")
    assert paced["forecast"]["profile"]["paced_long_prompts"] is True
    assert paced["forecast"]["rate_req_s"] > base["forecast"]["rate_req_s"]
    assert slow["forecast"]["rate_req_s"] < base["forecast"]["rate_req_s"]
    assert shared["forecast"]["rate_req_s"] > base["forecast"]["rate_req_s"]
    assert shared["forecast"]["profile"]["shared_prefix_decode"] is True
    assert slow["serving"] == base["serving"] == shared["serving"]
    fast_fp8 = run_json(capsys, "--fp8-flops", "3000")
    assert fast_fp8["replica"]["peak_flops"] == pytest.approx(4 * 3000e12)
    assert fast_fp8["forecast"]["rate_req_s"] > base["forecast"]["rate_req_s"]
    assert cli.main([*BRIEF, "--decode-efficiency", "1.5"]) == 2
    assert "decode_efficiency" in capsys.readouterr().err


def test_errors_exit_2(capsys):
    assert cli.main(["plan", "--model", "llama-3.1-70b", "--gpus", "1xH100"]) == 2
    assert "exceed" in capsys.readouterr().err
    assert cli.main(["plan", "--model", "llama-3.1-8b", "--gpus", "2xTPU"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    assert cli.main(["plan", "--model", "no-such-model"]) == 2
    assert "neither a preset" in capsys.readouterr().err
