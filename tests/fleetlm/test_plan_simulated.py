# `fleetlm plan --simulate` (fleetlm/capacity/simulated.py): steps priced by the planner's own
# roofline and efficiencies, the engine's scheduler run over the workload, the rate bisected.
import json

import pytest

from fleetlm import cli
from fleetlm.capacity import Deployment, EngineProfile, get_workload
from fleetlm.capacity.simulated import simulated_forecast, step_costs
from fleetlm.capacity.workloads import Workload

H200_70B = ["--model", "llama-3.1-70b", "--weights-dtype", "fp8", "--kv-dtype", "fp8"]
H200_70B += ["--gpus", "1xH200", "--workload", "seed"]


@pytest.fixture(autouse=True)
def only_plan(monkeypatch):
    monkeypatch.setattr(cli, "SUBCOMMANDS", {"plan": "fleetlm.plan_cmd"})


def test_step_costs_are_the_roofline_at_the_profiles_efficiencies():
    dep = Deployment.create("llama-3.1-70b", "1xH200", weights_dtype="fp8", kv_dtype="fp8")
    profile = EngineProfile(decode_efficiency=0.5, prefill_efficiency=0.7)
    costs = step_costs(dep, profile, kv_tokens=1000)
    bw = dep.bandwidth_bytes_s
    assert costs.fixed_s == pytest.approx(dep.weight_bytes_read / (bw * 0.5))
    assert costs.context_s == pytest.approx(dep.kv_bytes_per_token / (bw * 0.5))
    assert costs.token_s == pytest.approx(2 * dep.layer_params / (dep.peak_flops * 0.7))
    faster = step_costs(dep, EngineProfile(decode_efficiency=1.0), kv_tokens=1000)
    assert faster.fixed_s == pytest.approx(costs.fixed_s / 2)


def test_the_bisection_brackets_the_highest_rate_that_meets():
    dep = Deployment.create("llama-3.1-70b", "1xH200", weights_dtype="fp8", kv_dtype="fp8")
    sim = simulated_forecast(dep, get_workload("seed"), 300_000, EngineProfile(),
                             first_rate=0.5, duration_s=60.0)  # fmt: skip
    assert sim.best is not None and sim.best.meets
    assert len(sim.probes) == 7
    missed = [p.rate_req_s for p in sim.probes if not p.meets]
    assert missed and min(missed) > sim.rate_req_s  # a miss above the answer bounds it
    assert all(p.ttft_p95_s > 0 and p.tpot_p95_s > 0 for p in sim.probes)


def test_a_workload_without_simulated_traffic_is_refused():
    dep = Deployment.create("llama-3.1-8b", "1xH200")
    other = Workload("other", 100, 10, 1000, 0.0, 1.0, 4000, 0.05, 1000.0, 0.5)
    with pytest.raises(ValueError, match="no simulated traffic"):
        simulated_forecast(dep, other, 1000, EngineProfile(), first_rate=1.0)


def test_plan_simulate_prints_and_writes_the_section(capsys):
    args = ["plan", *H200_70B, "--simulate", "--simulate-seconds", "40",
            "--engine-set", "step_time_target_s=0.03"]  # fmt: skip
    assert cli.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"]["engine"] == {"step_time_target_s": 0.03}
    assert len(out["simulated"]["probes"]) == 7
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "rate at the targets" in text


def _trace(path, costs) -> None:
    """A worker's step trace (workers/gpu/step_timing.py's layout) of a machine whose steps
    cost `costs` exactly."""
    import numpy as np

    from engine.core.step_cost import StepFeatures, chunk_pairs

    rng = np.random.default_rng(0)
    fields = ["start", "gpu_s", "num_tokens", "num_decodes", "decode_context", "prefill_pairs"]
    rows = []
    for i in range(400):
        decodes = int(rng.integers(1, 128))
        chunk = int(rng.choice([0, 0, int(rng.integers(1, 2048))]))
        pairs = chunk_pairs(chunk, int(rng.integers(0, 8000))) if chunk else 0.0
        f = StepFeatures(decodes, decodes * int(rng.integers(500, 4000)), chunk, pairs)
        rows.append([i, costs.seconds(f), decodes + chunk, decodes, f.decode_context,
                     f.prefill_pairs])  # fmt: skip
    np.asarray(rows, dtype=np.float64).tofile(str(path) + ".f64")
    path.with_suffix(".json").write_text(json.dumps({"fields": fields}))


def test_a_step_trace_prices_the_simulation_with_the_measured_steps(tmp_path, capsys):
    # A machine whose steps take half what the roofline at the profile's efficiencies says:
    # priced by its trace, the simulated rate at the targets is higher, and the output says
    # what priced it.
    import dataclasses

    dep = Deployment.create("llama-3.1-70b", "1xH200", weights_dtype="fp8", kv_dtype="fp8")
    roofline = step_costs(dep, EngineProfile(), kv_tokens=300_000)
    fast = dataclasses.replace(roofline, **{
        k: getattr(roofline, k) / 2 for k in ("fixed_s", "context_s", "token_s", "pair_s")
    })  # fmt: skip
    _trace(tmp_path / "steps-w", fast)
    args = ["plan", *H200_70B, "--simulate", "--simulate-seconds", "40", "--json"]
    assert cli.main(args) == 0
    priced = json.loads(capsys.readouterr().out)["simulated"]
    assert cli.main([*args, "--step-trace", str(tmp_path / "steps-w")]) == 0
    measured = json.loads(capsys.readouterr().out)["simulated"]
    assert measured["costs"] == f"fit of {tmp_path / 'steps-w'}"
    assert priced["costs"] != measured["costs"]
    assert measured["rate_req_s"] > 1.3 * priced["rate_req_s"] > 0
    assert cli.main(["plan", *H200_70B, "--step-trace", str(tmp_path / "steps-w")]) == 2
    assert "add --simulate" in capsys.readouterr().err
    assert cli.main([*args, "--step-trace", str(tmp_path / "absent")]) == 2
    assert "absent" in capsys.readouterr().err
