# Where a step's GPU time goes, against its floor, on one GPU (issue 15's `nano` bar):
#   gemm     every projection of the model (qkv, o, gate_up, down, lm_head) through F.linear at
#            decode batch sizes, L2 flushed: ms, TB/s, TFLOP/s and the floor max(bytes / copy
#            rate, FLOPs / matmul rate) with the ceilings measured here; each BLAS backend torch
#            offers (cuBLAS, cuBLASLt).
#   decode   the engine's decode steps (CUDA-graph replays) at each batch size, a context like
#            nano's: GPU ms per step from events, each kernel family's ms from torch.profiler,
#            the gap between kernels (graph launch bubbles), the attention kernel's KV rate.
#   prefill  steps of only new prompt tokens (no decodes) at a few token counts: GPU ms against
#            the FLOP floor at the measured matmul rate.
#   python -m benchmarks.decode_breakdown [--model llama-3.1-8b] [--batches 1,32,128,256]
#       [--context 700] [--parts gemm,decode,prefill] [--quantization fp8]
#       [--kv-cache-dtype fp8] [--unfused-fp8-quant] [--json out.json]
from __future__ import annotations

import argparse
import json
import random
import traceback
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.sweeps.prefill_cases import time_ms
from engine import EngineConfig, LLMEngine, SamplingParams

# Kernel name fragments → family (first match wins; names are lower-cased).
FAMILIES = (
    ("decode_attn", ("paged_decode", "_decode_kernel", "decode_split", "decode_reduce")),
    ("prefill_attn", ("prefill", "ws_chunk", "prefix_merge")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "cublas", "matmul")),
    ("fp8_quant", ("quantize_fp8",)),
    ("rms_norm", ("rms_norm",)),
    ("rotary", ("rotary",)),
    ("store_kv", ("store_kv",)),
    ("silu_mul", ("silu",)),
    ("sampler", ("argmax", "reduce", "arg_", "max_")),
    ("copy", ("memcpy", "memset", "copy", "fill", "index", "elementwise", "vectorized")),
)


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def log(msg: str) -> None:
    print(msg, flush=True)


# -- GEMMs ---------------------------------------------------------------------------------


def projection_shapes(cfg) -> dict[str, tuple[int, int, int]]:
    """name → (N, K, times per step) of the model's linear layers (N output, K input)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    L = cfg.num_layers
    return {
        "qkv": (q + 2 * kv, cfg.hidden_size, L),
        "o": (cfg.hidden_size, q, L),
        "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size, L),
        "down": (cfg.hidden_size, cfg.intermediate_size, L),
        "lm_head": (cfg.vocab_size, cfg.hidden_size, 1),
    }


def part_gemm(cfg, batches: list[int], ceilings: dict) -> dict:
    bw, peak = ceilings["copy_bytes_s"], ceilings["bf16_matmul_flops"]
    backends = ["cublas", "cublaslt"]
    rows = []
    for name, (n, k, per_step) in projection_shapes(cfg).items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in batches:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            bytes_ = 2 * (n * k + m * k + m * n)
            flops = 2.0 * m * n * k
            floor_ms = 1e3 * max(bytes_ / bw, flops / peak)
            row = {"proj": name, "m": m, "n": n, "k": k, "per_step": per_step,
                   "floor_ms": floor_ms}  # fmt: skip
            for backend in backends:
                torch.backends.cuda.preferred_blas_library(backend)
                ms = time_ms(lambda x=x, w=w: F.linear(x, w))
                row[f"{backend}_ms"] = ms
                row[f"{backend}_eff"] = floor_ms / ms
            rows.append(row)
            log(f"  {name:8s} M={m:4d}: floor {floor_ms:.4f} ms, "
                + ", ".join(f"{b} {row[f'{b}_ms']:.4f} ms ({100 * row[f'{b}_eff']:.0f} %)"
                            for b in backends))  # fmt: skip
        del w
    torch.backends.cuda.preferred_blas_library("cublas")
    per_m = {}
    for m in batches:
        sel = [r for r in rows if r["m"] == m]
        per_m[m] = {
            key: sum(r[key] * r["per_step"] for r in sel)
            for key in ("floor_ms", *(f"{b}_ms" for b in backends))
        }
        log(f"  step GEMMs at M={m}: floor {per_m[m]['floor_ms']:.2f} ms, "
            + ", ".join(f"{b} {per_m[m][f'{b}_ms']:.2f} ms" for b in backends))  # fmt: skip
    return {"rows": rows, "per_step": per_m}


# -- engine steps ---------------------------------------------------------------------------


def kernel_table(prof, num_steps: int) -> dict[str, dict]:
    """kernel name → {ms per step, calls per step, family} from a profile of num_steps."""
    out: dict[str, dict] = {}
    for ev in prof.key_averages():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = ev.self_cuda_time_total
        if us <= 0:
            continue
        out[ev.key] = {
            "ms": us / 1e3 / num_steps,
            "calls": ev.count / num_steps,
            "family": family(ev.key),
        }
    return out


def by_family(table: dict[str, dict]) -> dict[str, float]:
    fam: dict[str, float] = defaultdict(float)
    for row in table.values():
        fam[row["family"]] += row["ms"]
    return dict(sorted(fam.items(), key=lambda kv: -kv[1]))


def gpu_ms_of_steps(engine, run) -> float:
    """Mean GPU ms per step of the steps `run()` makes (step trace events)."""
    trace = engine.enable_step_trace()
    run()
    sync()
    gpu = trace.columns()["gpu_s"]
    engine.disable_step_trace()
    gpu = gpu[~np.isnan(gpu)]
    return 1e3 * float(gpu.mean()) if len(gpu) else float("nan")


def drain(engine) -> None:
    for rid in list(engine.scheduler.requests):
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()


def part_decode(engine, batches: list[int], context: int, steps: int, ceilings: dict) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from fleetlm.bench.roofline_check import measured_deployment
    from fleetlm.capacity.roofline import decode_floor

    dep = measured_deployment(engine.config.model, "H200", ceilings, **deployment_dtypes(engine))
    kv_bytes_per_token = dep.kv_bytes_per_token
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    results = {}
    for bs in batches:
        params = SamplingParams(temperature=0, max_tokens=8 + 2 * steps + 160, ignore_eos=True)
        for i in range(bs):
            # nano-like spread: contexts U[context / 2, 3 context / 2]
            n = rng.randint(context // 2, 3 * context // 2)
            engine.add_request(f"d{bs}-{i}", [rng.randrange(vocab) for _ in range(n)], params)
        sched = engine.scheduler
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.requests.values()):
            engine.step()
        for _ in range(8):
            engine.step()
        lens = [r.num_tokens for r in sched.requests.values()]
        step_ms = gpu_ms_of_steps(engine, lambda: [engine.step() for _ in range(steps)])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                engine.step()
            sync()
        table = kernel_table(prof, steps)
        fams = by_family(table)
        kernel_ms = sum(fams.values())
        kv_gb = sum(lens) * kv_bytes_per_token / 1e9
        attn_ms = fams.get("decode_attn", float("nan"))
        floor = decode_floor(dep, bs, sum(lens) / len(lens))
        res = {
            "batch": bs, "mean_context": sum(lens) / len(lens), "gpu_ms_per_step": step_ms,
            "kernel_ms_per_step": kernel_ms, "gap_ms_per_step": step_ms - kernel_ms,
            "families_ms": fams, "kv_gb_per_step": kv_gb,
            "attention_tb_s": kv_gb / attn_ms if attn_ms == attn_ms and attn_ms > 0 else None,
            "kv_floor_ms": 1e3 * kv_gb * 1e9 / ceilings["copy_bytes_s"],
            "floor_ms": 1e3 * floor.seconds, "of_floor": 1e3 * floor.seconds / step_ms,
            "weight_floor_ms": 1e3 * floor.weight_bytes / ceilings["copy_bytes_s"],
            "kernels": dict(sorted(table.items(), key=lambda kv: -kv[1]["ms"])[:40]),
        }  # fmt: skip
        results[bs] = res
        log(f"  decode B={bs} ctx~{res['mean_context']:.0f}: GPU {step_ms:.2f} ms/step, "
            f"kernels {kernel_ms:.2f}, gap {res['gap_ms_per_step']:.2f}; "
            + ", ".join(f"{k} {v:.2f}" for k, v in fams.items())
            + f"; KV {kv_gb:.2f} GB, attention {res['attention_tb_s'] or 0:.2f} TB/s; "
            f"floor {res['floor_ms']:.2f} ms ({100 * res['of_floor']:.0f} % of it)")  # fmt: skip
        for name, row in list(res["kernels"].items())[:12]:
            log(f"      {row['ms']:7.3f} ms  x{row['calls']:5.1f}  {row['family']:12s} {name[:90]}")
        drain(engine)
    return results


def part_prefill(engine, token_counts: list[int], prompt_len: int, ceilings: dict) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from fleetlm.bench.roofline_check import measured_deployment
    from fleetlm.capacity.roofline import attention_flops_per_pair, causal_pairs

    dep = measured_deployment(engine.config.model, "H200", ceilings, **deployment_dtypes(engine))
    rng = random.Random(1)
    vocab = engine.model_config.vocab_size
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    results = {}
    for total in token_counts:
        n = max(1, total // prompt_len)

        def add(tag: str, n: int = n, total: int = total) -> None:
            for i in range(n):
                prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
                engine.add_request(f"p{total}-{tag}-{i}", prompt, one)

        add("warm")
        drain_steps(engine)
        add("timed")
        step_ms = gpu_ms_of_steps(engine, lambda: drain_steps(engine))
        add("prof")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            drain_steps(engine)
            sync()
        fams = by_family(kernel_table(prof, 1))
        flops = n * (2.0 * dep.layer_params * prompt_len + 2.0 * dep.lm_head_params)
        flops += n * attention_flops_per_pair(dep) * causal_pairs(prompt_len, 0)
        floor_ms = 1e3 * flops / ceilings["bf16_matmul_flops"]
        results[total] = {
            "prompts": n, "prompt_len": prompt_len, "gpu_ms": step_ms, "floor_ms": floor_ms,
            "efficiency": floor_ms / step_ms, "families_ms": fams,
        }  # fmt: skip
        log(f"  prefill {n} x {prompt_len}: GPU {step_ms:.2f} ms (floor {floor_ms:.2f}, "
            f"{100 * floor_ms / step_ms:.0f} %); "
            + ", ".join(f"{k} {v:.2f}" for k, v in fams.items()))  # fmt: skip
    return results


def deployment_dtypes(engine) -> dict[str, str]:
    """The planner's names for the engine's weight and KV-cache dtypes."""
    c = engine.config
    return {
        "weights_dtype": "fp8" if c.quantization == "fp8" else "bf16",
        "kv_dtype": "fp8" if c.kv_cache_dtype == "fp8" else "bf16",
    }


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def drain_steps(engine) -> None:
    while engine.has_unfinished():
        engine.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batches", default="1,32,64,128,256")
    ap.add_argument("--context", type=int, default=700)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prefill-tokens", default="2048,4096,8192")
    ap.add_argument("--prefill-prompt", type=int, default=512)
    ap.add_argument("--parts", default="gemm,decode,prefill")
    ap.add_argument("--quantization", default=None, choices=["fp8"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    ap.add_argument(
        "--unfused-fp8-quant", action="store_true",
        help="FP8 layers quantize their own inputs (a separate quantize_fp8 before each), as "
        "before the norms and SiLU-and-mul emitted e4m3 rows (engine/models/fp8_activation.py)",
    )  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from engine.models import fp8_activation

    fp8_activation.FUSE_ACTIVATION_QUANT = not args.unfused_fp8_quant
    from fleetlm.bench.roofline_check import measure_ceilings

    parts = set(args.parts.split(","))
    batches = [int(b) for b in args.batches.split(",")]
    ceilings = measure_ceilings()
    log(f"ceilings: copy {ceilings['copy_bytes_s'] / 1e12:.2f} TB/s, "
        f"bf16 matmul {ceilings['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s")  # fmt: skip
    result: dict = {"model": args.model, "device": torch.cuda.get_device_name(),
                    "ceilings": ceilings, "context": args.context,
                    "fused_fp8_quant": fp8_activation.FUSE_ACTIVATION_QUANT}  # fmt: skip
    counts = [int(t) for t in args.prefill_tokens.split(",")]
    # Overlap off: each step's events bracket its own work. The budget admits the largest
    # prefill step whole (decode steps do not depend on it).
    engine = LLMEngine(
        EngineConfig(
            model=args.model, max_num_seqs=max(batches), overlap_scheduling=False,
            max_num_batched_tokens=max(4096, *counts),
            quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        )
    )  # fmt: skip
    steps = {
        "gemm": lambda: part_gemm(engine.runner.shape, batches, ceilings),
        "decode": lambda: part_decode(engine, batches, args.context, args.steps, ceilings),
        "prefill": lambda: part_prefill(engine, counts, args.prefill_prompt, ceilings),
    }
    for name, run in steps.items():
        if name not in parts:
            continue
        log(name)
        try:  # one part's failure still leaves the others' figures
            result[name] = run()
        except Exception:
            log(traceback.format_exc())
            try:
                drain(engine)
            except Exception:
                log(traceback.format_exc())
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
