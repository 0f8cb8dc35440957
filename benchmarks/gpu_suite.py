# The whole GPU suite in one device call: kernel checks and microbenchmarks, the engine on the
# `nano` and `seed` workloads, the HF transformers peer, and the roofline for each — JSON under
# --out and a short table at the end.
#   python -m benchmarks.gpu_suite --out $OUT [--parts kernels,nano,seed,peer] [--quick]
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from fleetlm.bench.engine_bench import run_workload, workload_floor_s
from fleetlm.bench.roofline_check import measure_ceilings
from fleetlm.bench.workloads import SEED_TRAFFIC, describe, generate, nano

MODEL = "llama-3.1-8b"
TTFT_TARGET_S, TPOT_TARGET_S = 0.8, 0.040
PROFILE = False


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_engine(**overrides):
    from engine import EngineConfig, LLMEngine

    options = dict(model=MODEL, dtype="bfloat16", max_num_seqs=256, max_num_batched_tokens=8192)
    options.update(overrides)
    return LLMEngine(EngineConfig(**options))


def warm_up(engine) -> None:
    from fleetlm.bench.workloads import BenchRequest

    # Compile every kernel specialisation the measured runs will hit: short and full-budget
    # prefills, chunked prefills over cached blocks, and decodes at many batch sizes.
    reqs = [BenchRequest(list(range(10, 60 * (i + 1))), 8, "interactive", 0.0) for i in range(4)]
    reqs += [BenchRequest(list(range(100, 3100 + 7 * i)), 3 + i, "batch", 0.0) for i in range(8)]
    reqs += [BenchRequest(list(range(5, 20005)), 2, "interactive", 0.0)]
    run_workload(engine, reqs, timeout_s=300, detokenize=False)
    engine.block_manager.reset_prefix_cache()


def deployment(ceilings: dict):
    from fleetlm.bench.roofline_check import measured_deployment

    return measured_deployment(MODEL, "H200", ceilings)


def part_nano(results: dict, quick: bool) -> None:
    engine = make_engine()
    warm_up(engine)
    reqs = nano(64 if quick else 256, vocab=engine.model_config.vocab_size)
    # One untimed pass compiles whatever kernel specialisation this mix of shapes needs.
    run_workload(engine, reqs, detokenize=False)
    engine.block_manager.reset_prefix_cache()
    if PROFILE:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    # Token ids only, as nano-vllm's bench does; then again with detokenization, as serving does.
    res = run_workload(engine, reqs, detokenize=False)
    if PROFILE:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    engine.block_manager.reset_prefix_cache()  # a rerun must not hit the first run's prompts
    results["nano_detokenized"] = run_workload(engine, reqs, detokenize=True)
    floor = workload_floor_s(deployment(results["ceilings"]), reqs, max_batch=256)
    res["workload"] = describe(reqs)
    res["roofline"] = floor
    res["achieved_over_roofline"] = res["output_tok_s"] / floor["roofline_output_tok_s"]
    res["num_kv_blocks"] = engine.block_manager.num_blocks
    results["nano"] = res
    del engine


def seed_requests(n: int, rate: float | None, vocab: int, seed: int) -> list:
    return generate(SEED_TRAFFIC, vocab=vocab, seed=seed, rate=rate, num_requests=n)


def part_seed(results: dict, quick: bool) -> None:
    engine = make_engine()
    warm_up(engine)
    vocab = engine.model_config.vocab_size
    dep = deployment(results["ceilings"])
    n = 60 if quick else 160
    run_workload(engine, seed_requests(24, None, vocab, seed=9), detokenize=False)
    engine.block_manager.reset_prefix_cache()
    runs = {}
    burst = seed_requests(n, None, vocab, seed=1)
    r = run_workload(engine, burst)
    r["roofline"] = workload_floor_s(dep, burst, max_batch=256, cached_fraction=0.6)
    r["achieved_over_roofline"] = r["output_tok_s"] / r["roofline"]["roofline_output_tok_s"]
    runs["all_at_once"] = r
    engine.block_manager.reset_prefix_cache()
    best = None
    for rate in [2.0, 4.0] if quick else [4.0, 6.0, 8.0, 12.0]:
        reqs = seed_requests(n if quick else n // 2, rate, vocab, seed=2)
        r = run_workload(engine, reqs)
        r["rate_req_s"] = rate
        r["meets_targets"] = (
            r["ttft_s"]["p95"] < TTFT_TARGET_S and r["tpot_s"]["p95"] < TPOT_TARGET_S
        )
        runs[f"rate_{rate}"] = r
        engine.block_manager.reset_prefix_cache()
        log(f"seed rate {rate}: {one_line(r)}")
        if r["meets_targets"]:
            best = r
        else:
            break
    results["seed"] = {
        "workload": describe(burst),
        "runs": runs,
        "best_rate_meeting_targets": best["rate_req_s"] if best else None,
        "output_tok_s_at_best_rate": best["output_tok_s"] if best else None,
    }
    del engine


def part_peer(results: dict, quick: bool) -> None:
    from engine.models.config import PRESETS
    from fleetlm.bench import hf_peer

    cfg = PRESETS[MODEL]
    model = hf_peer.build_hf_model(cfg)
    reqs = nano(256, vocab=cfg.vocab_size)
    peer = {}
    try:
        peer["static"] = hf_peer.run_static(model, reqs[:64], batch_size=64)
    except Exception as exc:  # report, don't lose the rest of the suite
        peer["static"] = {"error": repr(exc), "trace": traceback.format_exc()[-2000:]}
    try:
        peer["continuous"] = hf_peer.run_continuous(model, reqs[:16])
    except Exception as exc:
        peer["continuous"] = {"error": repr(exc), "trace": traceback.format_exc()[-2000:]}
    forms = [p for p in peer.values() if "output_tok_s" in p]
    peer["best_output_tok_s"] = max((p["output_tok_s"] for p in forms), default=None)
    results["peer"] = peer
    del model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--parts", default="kernels,nano,seed,peer")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile the nano run")
    args = ap.parse_args()
    global PROFILE
    PROFILE = args.profile
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "model": MODEL,
    }
    import triton

    results["triton"] = triton.__version__
    results["ceilings"] = measure_ceilings()  # fleetlm/bench/roofline_check.py
    log(f"ceilings: copy {results['ceilings']['copy_bytes_s'] / 1e12:.2f} TB/s, "
        f"bf16 {results['ceilings']['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s")  # fmt: skip
    parts = args.parts.split(",")
    if "kernels" in parts:
        log("kernels")
        cmd = [sys.executable, "-m", "benchmarks.kernel_bench", "--json", str(out / "kernels.json")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        print(proc.stdout[-6000:], proc.stderr[-3000:], flush=True)
        results["kernels_rc"] = proc.returncode
    for name, fn in (("nano", part_nano), ("seed", part_seed), ("peer", part_peer)):
        if name not in parts:
            continue
        log(name)
        try:
            fn(results, args.quick)
        except Exception as exc:
            results[name] = {"error": repr(exc), "trace": traceback.format_exc()[-3000:]}
            print(traceback.format_exc(), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        (out / "gpu_suite.json").write_text(json.dumps(results, indent=2, default=str))
    summarize(results)
    (out / "gpu_suite.json").write_text(json.dumps(results, indent=2, default=str))


def one_line(x: dict) -> str:
    return (
        f"{x['output_tok_s']:.0f} out tok/s, {x['total_tok_s']:.0f} total tok/s, "
        f"TTFT p50/p95 {x['ttft_s']['p50']:.3f}/{x['ttft_s']['p95']:.3f}s, "
        f"TPOT p50/p95 {1e3 * x['tpot_s']['p50']:.1f}/{1e3 * x['tpot_s']['p95']:.1f}ms, "
        f"GPU idle {100 * x['gpu_idle_fraction']:.1f}%, steps {x['steps']}, "
        f"mean step {x['mean_step_ms']:.1f}ms (p50 {x['step_ms']['p50']:.1f}, "
        f"p99 {x['step_ms']['p99']:.1f}, max {x['step_ms']['max']:.0f}), "
        f"hit {x['prefix_hit_rate']:.2f}, preempt {x['preemptions']}"
    )


def summarize(r: dict) -> None:
    print("\n== summary ==")
    x = r.get("nano", {})
    if "output_tok_s" in x:
        pct = 100 * x["achieved_over_roofline"]
        bound = x["roofline"]["roofline_output_tok_s"]
        print(f"nano: {one_line(x)}; roofline {bound:.0f} ({pct:.0f}%)")
        print(f"nano step breakdown: {x['step_breakdown_fraction']}")
    elif x:
        print(f"nano: {x.get('error')}")
    s = r.get("seed", {})
    for k, run in s.get("runs", {}).items():
        print(f"seed {k}: {one_line(run)}")
    if "runs" in s:
        print(f"seed best rate meeting targets: {s['best_rate_meeting_targets']}")
    if "output_tok_s" in r.get("nano_detokenized", {}):
        print(f"nano with detokenization: {one_line(r['nano_detokenized'])}")
    elif s:
        print(f"seed: {s.get('error')}")
    p = r.get("peer", {})
    for k in ("static", "continuous"):
        if k in p:
            print(f"peer {k}: {p[k].get('output_tok_s', p[k].get('error'))}")
    if p.get("best_output_tok_s") and "output_tok_s" in x:
        print(f"fleetlm / best peer on nano: {x['output_tok_s'] / p['best_output_tok_s']:.1f}x")


if __name__ == "__main__":
    main()
