# Goodput beside the plan, with the ceilings measured in the same run: `fleetlm bench serve
# --compare-engine` on a GPU measures the device's copy bandwidth and bf16 (and FP8) matmul
# rates after its engine sweep (the engine's process, the engine's GPU) and sets each backend's
# goodput against `fleetlm plan` for the traffic: the serving floor with those ceilings and
# with the datasheet's, and the forecast (capacity/forecast.py) with those ceilings.
from __future__ import annotations

from fleetlm.capacity.deployment import Deployment
from fleetlm.capacity.forecast import EngineProfile, forecast, forecast_at
from fleetlm.capacity.memory import memory_plan
from fleetlm.capacity.plan import make_plan
from fleetlm.capacity.workloads import get_workload


def measure_ceilings(device=None) -> dict:
    """Copy bandwidth (read + write of 1 GiB buffers, far beyond L2), the bf16 8192³ matmul
    rate and, where the GPU has FP8 tensor cores, the e4m3 one of a CUDA device, each the
    median of timed repetitions."""
    ceilings = {"copy_bytes_s": _copy_bytes_s(device), "bf16_matmul_flops": _matmul_flops(device)}
    fp8 = _fp8_matmul_flops(device)
    return ceilings if fp8 is None else ceilings | {"fp8_matmul_flops": fp8}


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


def _fp8_matmul_flops(device) -> float | None:
    import torch
    import triton.testing

    dev = torch.device(device or "cuda")
    if torch.cuda.get_device_capability(dev) < (8, 9):
        return None  # no FP8 tensor cores
    a = torch.randn(8192, 8192, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device=dev).to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device=dev)

    def mm():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    try:
        ms = triton.testing.do_bench(mm, warmup=50, rep=300, return_mode="median")
    except RuntimeError:  # a torch build without the FP8 GEMM: the bf16 rate stands in
        return None
    return 2 * 8192**3 / (ms * 1e-3)


def measured_deployment(model, gpu: str, ceilings: dict, **dtypes) -> Deployment:
    """One `gpu` (a fleetlm.capacity GPU name) with measure_ceilings' copy and matmul rates in
    place of the datasheet's (the FP8 rate only where it was measured)."""
    return Deployment.create(
        model, f"1x{gpu}", bandwidth_bytes_s=ceilings["copy_bytes_s"],
        flops=ceilings["bf16_matmul_flops"], fp8_flops=ceilings.get("fp8_matmul_flops"),
        **dtypes,
    )  # fmt: skip


def roofline_report(
    model: str,
    gpu: str,
    ceilings: dict,
    goodput_tok_s: dict[str, float],
    workload: str = "seed",
    *,
    weights_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    goodput_rate: dict[str, float] | None = None,
    profile: EngineProfile | None = None,
) -> dict:
    """Each backend's goodput against the plan for one GPU: as a fraction of the serving floor
    computed with the measured ceilings and with the datasheet's, and, for the rates in
    `goodput_rate` (req/s), measured ÷ forecast at the same traffic and ceilings."""
    wl = get_workload(workload)
    dtypes = {"weights_dtype": weights_dtype, "kv_dtype": kv_dtype}
    measured = make_plan(measured_deployment(model, gpu, ceilings, **dtypes), wl, profile=profile)
    roof = measured.serving.output_tok_s
    sheet = make_plan(Deployment.create(model, f"1x{gpu}", **dtypes), wl).serving.output_tok_s
    forecast = measured.forecast
    report = {
        "gpu": gpu,
        "ceilings": ceilings,
        "roofline_output_tok_s": roof,
        "datasheet_roofline_output_tok_s": sheet,
        "goodput_fraction": {name: tok_s / roof for name, tok_s in goodput_tok_s.items()},
        "goodput_fraction_of_datasheet": {
            name: tok_s / sheet for name, tok_s in goodput_tok_s.items()
        },
        "forecast": forecast.to_dict(),
    }
    if goodput_rate and forecast.rate_req_s > 0:
        report["goodput_over_forecast"] = {
            name: rate / forecast.rate_req_s for name, rate in goodput_rate.items()
        }
    return report


def roofline_line(report: dict) -> str:
    """The console summary of roofline_report."""
    c, f = report["ceilings"], report["forecast"]
    rates = [f"copy {c['copy_bytes_s'] / 1e12:.2f} TB/s",
             f"bf16 {c['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s"]  # fmt: skip
    if "fp8_matmul_flops" in c:
        rates.append(f"fp8 {c['fp8_matmul_flops'] / 1e12:.0f} TFLOP/s")
    line = (
        f"roofline (1x{report['gpu']}, {', '.join(rates)} measured now): "
        f"{report['roofline_output_tok_s']:,.0f} output tok/s (datasheet "
        f"{report['datasheet_roofline_output_tok_s']:,.0f}); goodput "
        + ", ".join(f"{k} {v:.0%}" for k, v in report["goodput_fraction"].items())
    )
    line += (
        f"\nforecast (fleetlm plan, same traffic and ceilings): {f['rate_req_s']:.2f} req/s = "
        f"{f['output_tok_s']:,.0f} output tok/s, limited by {f['limited_by']}"
    )
    ratios = report.get("goodput_over_forecast")
    if ratios:
        line += "; measured ÷ forecast " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
    return line


def forecast_at_rates(
    model: str,
    gpu: str,
    ceilings: dict,
    rates: list[float],
    workload: str = "seed",
    *,
    weights_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    profile: EngineProfile | None = None,
) -> dict:
    """The plan's forecast for one `gpu` with the measured ceilings, and its operating point
    at each rate, to set beside runs at those rates (`fleetlm bench engine --workload seed`)."""
    wl = get_workload(workload)
    dep = measured_deployment(model, gpu, ceilings, weights_dtype=weights_dtype, kv_dtype=kv_dtype)
    kv = memory_plan(dep, wl).kv_tokens
    return {
        "gpu": gpu,
        "ceilings": ceilings,
        "forecast": forecast(dep, wl, kv, profile).to_dict(),
        "at_rate": {str(r): forecast_at(dep, wl, r, kv, profile or EngineProfile()).to_dict()
                    for r in rates},
    }  # fmt: skip
