# Goodput beside the roofline, with the ceilings measured in the same run: `fleetlm bench serve
# --compare-engine` on a GPU measures the device's copy bandwidth and bf16 matmul rate after
# its engine sweep (the engine's process, the engine's GPU) and sets each backend's goodput
# against `fleetlm plan`'s serving bound for the traffic, with those ceilings and with the
# datasheet's.
from __future__ import annotations

from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.plan import make_plan
from fleetlm.capacity.workloads import get_workload


def measure_ceilings(device=None, *, fp8: bool = False) -> dict:
    """Copy bandwidth (read + write of 1 GiB buffers, far beyond L2) and the bf16 8192³ matmul
    rate of a CUDA device, each the median of timed repetitions; with fp8, the e4m3 8192³
    torch._scaled_mm rate (row-wise scales, as the engine's FP8 layers) too."""
    ceilings = {"copy_bytes_s": _copy_bytes_s(device), "bf16_matmul_flops": _matmul_flops(device)}
    if fp8:
        ceilings["fp8_matmul_flops"] = _fp8_matmul_flops(device)
    return ceilings


def _copy_bytes_s(device) -> float:
    import torch
    import triton.testing

    n = 1 << 28
    src = torch.randn(n, device=device or "cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * n * 4 / (ms * 1e-3)


def _matmul_flops(device) -> float:
    import torch
    import triton.testing

    a = torch.randn(8192, 8192, device=device or "cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3)


def _fp8_matmul_flops(device) -> float:
    import torch
    import triton.testing

    a = torch.randn(8192, 8192, device=device or "cuda").to(torch.float8_e4m3fn)
    b = torch.randn_like(a, dtype=torch.float32).to(torch.float8_e4m3fn)
    sa = torch.rand(8192, 1, device=a.device) + 0.5
    sb = torch.rand(1, 8192, device=a.device) + 0.5

    def mm():
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    ms = triton.testing.do_bench(mm, warmup=50, rep=300, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3)


def measured_deployment(model, gpu: str, ceilings: dict, **dtypes) -> Deployment:
    """One `gpu` (a fleetlm.capacity GPU name) with measure_ceilings' copy and matmul rates in
    place of the datasheet's; FP8 weights take the e4m3 matmul rate when it was measured."""
    flops = ceilings["bf16_matmul_flops"]
    if dtypes.get("weights_dtype") == "fp8" and "fp8_matmul_flops" in ceilings:
        flops = ceilings["fp8_matmul_flops"]
    return Deployment.create(
        model, f"1x{gpu}", bandwidth_bytes_s=ceilings["copy_bytes_s"], flops=flops, **dtypes
    )


def roofline_report(
    model: str,
    gpu: str,
    ceilings: dict,
    goodput_tok_s: dict[str, float],
    workload: str = "seed",
    *,
    weights_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> dict:
    """Each backend's goodput (output tok/s) as a fraction of the serving roofline for one GPU,
    computed with the measured ceilings and with the datasheet's."""
    wl = get_workload(workload)
    dtypes = {"weights_dtype": weights_dtype, "kv_dtype": kv_dtype}
    measured = measured_deployment(model, gpu, ceilings, **dtypes)
    roof = make_plan(measured, wl).serving.output_tok_s
    sheet = make_plan(Deployment.create(model, f"1x{gpu}", **dtypes), wl).serving.output_tok_s
    return {
        "gpu": gpu,
        "ceilings": ceilings,
        "roofline_output_tok_s": roof,
        "datasheet_roofline_output_tok_s": sheet,
        "goodput_fraction": {name: tok_s / roof for name, tok_s in goodput_tok_s.items()},
        "goodput_fraction_of_datasheet": {
            name: tok_s / sheet for name, tok_s in goodput_tok_s.items()
        },
    }
