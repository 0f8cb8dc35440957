# Speculative decoding benchmark: TPOT and output tok/s with and without speculation, over a
# grid of acceptance rate × concurrency, and the batch size where speculation stops helping.
#
# Dummy weights make natural acceptance meaningless, so it is dialled in: the draft is the
# target itself (same preset, same seed → same weights), and the draft proposer's test hook
# spoils each draft token with probability c. With k drafts per step the expected acceptance
# rate is (1/k)·Σ_{j=1..k} (1-c)^j; c is solved for each target rate, and the measured rate
# is reported next to it (bf16 rounding between the decode and verify kernels can flip a few
# near-tied argmaxes, so it lands a little below the target).
# Speculation runs with the adaptive policy disabled (no batch gate, no acceptance cut-off):
# the surface is the raw cost/benefit the policy's thresholds should be set from.
#
#   python benchmarks/spec_bench.py                       # H200: llama-3.1-8b, c ∈ 1,8,64,256
#   python benchmarks/spec_bench.py --smoke               # CPU: tiny preset, seconds
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from fleetlm.bench.engine_bench import run_workload
from fleetlm.bench.workloads import BenchRequest


def corrupt_fraction_for(acceptance: float, k: int) -> float:
    """c such that (1/k)·Σ_{j=1..k} (1-c)^j == acceptance (bisection; monotone in c)."""

    def rate(c: float) -> float:
        return sum((1 - c) ** j for j in range(1, k + 1)) / k

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) > acceptance else (lo, mid)
    return (lo + hi) / 2


def workload(concurrency: int, prompt_len: int, out_len: int, vocab: int, seed: int):
    rng = random.Random(seed)
    return [
        BenchRequest(
            prompt_ids=[rng.randrange(vocab) for _ in range(prompt_len)],
            max_tokens=out_len,
            priority="interactive",
            arrival_s=0.0,
        )
        for _ in range(concurrency)
    ]


def measure(engine: LLMEngine, concurrency: int, args, vocab: int) -> dict:
    s0 = engine.stats()
    result = run_workload(
        engine,
        workload(concurrency, args.prompt_len, args.out_len, vocab, concurrency),
        detokenize=False,
    )
    s1 = engine.stats()
    drafts = s1.spec_decode_num_draft_tokens - s0.spec_decode_num_draft_tokens
    accepted = s1.spec_decode_num_accepted_tokens - s0.spec_decode_num_accepted_tokens
    return {
        "tpot_p50_ms": 1e3 * result["tpot_s"]["p50"],
        "output_tok_s": result["output_tok_s"],
        "steps": result["steps"],
        "draft_tokens": drafts,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafts if drafts else None,
        "unexpected_finishes": result["unexpected_finishes"],
    }


def build(args, speculative: bool, max_seqs: int) -> LLMEngine:
    options = dict(
        model=args.model,
        device=args.device,
        max_num_seqs=max_seqs,
        max_model_len=args.prompt_len + args.out_len + 32,
        max_num_batched_tokens=max(args.budget, max_seqs * (args.k + 1)),
    )
    if args.num_kv_blocks:
        options["num_kv_blocks"] = args.num_kv_blocks
    if speculative:
        options |= dict(
            speculative_method="draft",
            draft_model=args.model,
            num_speculative_tokens=args.k,
            spec_max_batch_size=10**6,
            spec_min_acceptance=0.0,
        )
    return LLMEngine(EngineConfig(**options))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--concurrency", default="1,8,64,256")
    parser.add_argument("--acceptance", default="0.3,0.6,0.9")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--out-len", type=int, default=256)
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--num-kv-blocks", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/spec_decode.json")
    parser.add_argument("--smoke", action="store_true", help="tiny preset on the CPU")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.device, args.concurrency = "tiny", "cpu", "1,4"
        args.prompt_len, args.out_len, args.num_kv_blocks = 32, 24, 256
        args.out = str(Path(tempfile.gettempdir()) / "spec_decode_smoke.json")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    targets = [float(a) for a in args.acceptance.split(",")]
    max_seqs = max(concurrency)

    t0 = time.time()
    rows = []
    base = build(args, speculative=False, max_seqs=max_seqs)
    vocab = base.model_config.vocab_size
    measure(base, min(concurrency), args, vocab)  # warm-up (Triton compiles, caches)
    baseline = {c: measure(base, c, args, vocab) for c in concurrency}
    del base
    spec = build(args, speculative=True, max_seqs=max_seqs)
    spec.runner.draft.corrupt_fraction = 0.0
    measure(spec, min(concurrency), args, vocab)  # warm-up
    for target in targets:
        spec.runner.draft.corrupt_fraction = corrupt_fraction_for(target, args.k)
        for c in concurrency:
            r = measure(spec, c, args, vocab)
            b = baseline[c]
            rows.append(
                {
                    "target_acceptance": target,
                    "corrupt_fraction": spec.runner.draft.corrupt_fraction,
                    "concurrency": c,
                    "baseline": b,
                    "speculative": r,
                    "tpot_speedup": b["tpot_p50_ms"] / r["tpot_p50_ms"],
                    "throughput_speedup": r["output_tok_s"] / b["output_tok_s"],
                }
            )
    # Per acceptance: the smallest measured batch size where speculation no longer speeds up
    # output tok/s (None: it helped at every size measured).
    crossover = {}
    for target in targets:
        losing = [
            r["concurrency"]
            for r in rows
            if r["target_acceptance"] == target and r["throughput_speedup"] < 1.0
        ]
        crossover[str(target)] = min(losing) if losing else None

    print(
        f"\n{args.model} on {args.device}, k={args.k}, prompt {args.prompt_len}, "
        f"output {args.out_len}"
    )
    header = f"{'accept':>7} {'meas':>6} {'conc':>5} {'TPOT base':>10} {'TPOT spec':>10} "
    print(header + f"{'tok/s base':>11} {'tok/s spec':>11} {'speedup':>8}")
    for r in rows:
        b, s = r["baseline"], r["speculative"]
        meas = s["acceptance"] if s["acceptance"] is not None else float("nan")
        print(
            f"{r['target_acceptance']:>7.2f} {meas:>6.2f} {r['concurrency']:>5} "
            f"{b['tpot_p50_ms']:>8.2f}ms {s['tpot_p50_ms']:>8.2f}ms "
            f"{b['output_tok_s']:>11.1f} {s['output_tok_s']:>11.1f} "
            f"{r['throughput_speedup']:>7.2f}x"
        )
    print(f"speculation stops helping (tok/s) at concurrency: {crossover}")

    out = {
        "model": args.model,
        "device": args.device,
        "k": args.k,
        "prompt_len": args.prompt_len,
        "out_len": args.out_len,
        "concurrency": concurrency,
        "rows": rows,
        "crossover_concurrency": crossover,
        "wall_s": time.time() - t0,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
