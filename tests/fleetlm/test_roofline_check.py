# Goodput against the serving roofline of ceilings measured in the run (bench/roofline_check.py).
import pytest

from fleetlm.bench.roofline_check import forecast_at_rates, roofline_line, roofline_report
from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.gpus import gpu_for_device
from fleetlm.capacity.plan import make_plan
from fleetlm.capacity.workloads import get_workload


@pytest.mark.parametrize(
    ("name", "key"),
    [("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("Tesla T4", None)],
)
def test_cuda_device_names_map_to_the_planners_gpus(name, key):
    assert gpu_for_device(name) == key


def test_goodput_is_set_against_the_roofline_of_the_measured_ceilings():
    ceilings = {"copy_bytes_s": 4.24e12, "bf16_matmul_flops": 714.5e12}
    report = roofline_report("llama-3.1-8b", "H200", ceilings, {"engine": 4070.0, "served": 3334.0})
    measured = Deployment.create(
        "llama-3.1-8b", "1xH200", bandwidth_bytes_s=4.24e12, flops=714.5e12
    )
    roof = make_plan(measured, get_workload("seed")).serving.output_tok_s
    assert report["roofline_output_tok_s"] == pytest.approx(roof)
    # Slower than the datasheet's 4.8 TB/s and 989 TFLOP/s: a lower bound to reach.
    assert report["roofline_output_tok_s"] < report["datasheet_roofline_output_tok_s"]
    assert report["goodput_fraction"]["engine"] == pytest.approx(4070.0 / roof)
    assert report["goodput_fraction"]["served"] < report["goodput_fraction"]["engine"]
    sheet = report["datasheet_roofline_output_tok_s"]
    assert report["goodput_fraction_of_datasheet"]["engine"] == pytest.approx(4070.0 / sheet)


def test_an_fp8_deployment_has_a_higher_roofline_than_bf16():
    ceilings = {"copy_bytes_s": 4.24e12, "bf16_matmul_flops": 714.5e12}
    bf16 = roofline_report("llama-3.1-8b", "H200", ceilings, {"engine": 1.0})
    fp8 = roofline_report(
        "llama-3.1-8b", "H200", ceilings, {"engine": 1.0}, weights_dtype="fp8", kv_dtype="fp8"
    )
    assert fp8["roofline_output_tok_s"] > bf16["roofline_output_tok_s"]


def test_goodput_is_set_against_the_forecast_for_the_same_traffic_and_ceilings():
    ceilings = {"copy_bytes_s": 4.24e12, "bf16_matmul_flops": 675e12}
    report = roofline_report(
        "llama-3.1-8b", "H200", ceilings, {"engine": 4148.0, "served": 4128.0},
        goodput_rate={"engine": 12.0, "served": 12.0},
    )  # fmt: skip
    measured = Deployment.create("llama-3.1-8b", "1xH200", bandwidth_bytes_s=4.24e12, flops=675e12)
    plan = make_plan(measured, get_workload("seed"))
    f = report["forecast"]
    assert f["rate_req_s"] == pytest.approx(plan.forecast.rate_req_s)
    assert f["output_tok_s"] < report["roofline_output_tok_s"]  # below the floor
    ratio = report["goodput_over_forecast"]["served"]
    assert ratio == pytest.approx(12.0 / f["rate_req_s"])
    assert 0.85 <= ratio <= 1.15  # the done-when bar of issue 35, on run 18's goodput
    line = roofline_line(report)
    assert "forecast" in line and f"served {ratio:.2f}" in line and "measured ÷ forecast" in line
    # Without the rates the report still carries the forecast, and no ratio.
    assert "goodput_over_forecast" not in roofline_report("llama-3.1-8b", "H200", ceilings, {})


def test_a_measured_fp8_matmul_rate_is_used_for_fp8_weights():
    bf16_only = {"copy_bytes_s": 4.24e12, "bf16_matmul_flops": 675e12}
    with_fp8 = bf16_only | {"fp8_matmul_flops": 1165e12}
    kw = {"weights_dtype": "fp8"}
    slow = roofline_report("llama-3.1-70b", "H200", bf16_only, {}, **kw)["forecast"]
    fast = roofline_report("llama-3.1-70b", "H200", with_fp8, {}, **kw)["forecast"]
    assert fast["rate_req_s"] > slow["rate_req_s"] > 0
    assert "fp8 1165 TFLOP/s" in roofline_line(
        roofline_report("llama-3.1-70b", "H200", with_fp8, {}, **kw)
    )


def test_runs_at_fixed_rates_get_the_forecasts_operating_point_at_each():
    ceilings = {"copy_bytes_s": 4.24e12, "bf16_matmul_flops": 675e12}
    report = forecast_at_rates("llama-3.1-8b", "H200", ceilings, [8.0, 12.0, 40.0])
    low, mid, past = (report["at_rate"][k] for k in ("8.0", "12.0", "40.0"))
    assert low["tpot_p95_s"] < mid["tpot_p95_s"] and low["violated"] is None
    assert past["violated"] == "throughput"
    assert 8.0 < report["forecast"]["rate_req_s"] < 40.0
