# Goodput against the serving roofline of ceilings measured in the run (bench/roofline_check.py).
import pytest

from fleetlm.bench.roofline_check import roofline_report
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
