# Host-side cost of one engine step with the forward pass stubbed out: scheduling, batch
# preparation and output bookkeeping, at 64 and 256 running sequences. This is the time the
# GPU would sit idle between steps if nothing overlapped it.
#   python -m benchmarks.scheduler_overhead [--json benchmarks/results/scheduler_overhead_cpu.json]
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from datetime import UTC, datetime

import torch

from engine.core.block_manager import BlockManager
from engine.core.request import Priority, Request
from engine.core.scheduler import Scheduler
from engine.runner.batch_builder import BatchBuilder
from engine.sampling_params import SamplingParams


def run_case(num_seqs: int, prompt_len: int, decode_steps: int, block_size: int = 16) -> dict:
    rng = random.Random(0)
    num_blocks = num_seqs * ((prompt_len + decode_steps + 64) // block_size + 2)
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_batched_tokens=8192, max_num_seqs=num_seqs)
    builder = BatchBuilder(block_size, torch.device("cpu"))
    params = SamplingParams(temperature=0, max_tokens=decode_steps + 64, ignore_eos=True)
    for i in range(num_seqs):
        prompt = [rng.randrange(32000) for _ in range(prompt_len)]
        prio = Priority.BATCH if i % 3 == 0 else Priority.INTERACTIVE
        sched.add_request(Request(f"r{i}", prompt, params, prio, params.max_tokens))

    def one_step() -> tuple[float, float, float, int]:
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        batch = builder.prepare(out) if not out.is_empty else None
        t2 = time.perf_counter()
        # Stub forward: one random token per sampling row.
        n = len(batch.sampling_requests) if batch else 0
        sampled = [rng.randrange(32000) for _ in range(n)]
        sched.update_from_output(out, sampled)
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, out.num_decodes

    while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.requests.values()):
        one_step()  # prefill (chunked by the token budget)
    for _ in range(5):
        one_step()  # warm-up
    samples = [one_step() for _ in range(decode_steps)]
    assert all(s[3] == num_seqs for s in samples), "every step should decode every sequence"
    med = {
        k: statistics.median(s[i] for s in samples) * 1e3
        for i, k in enumerate(("schedule_ms", "prepare_ms", "update_ms"))
    }
    med["total_ms"] = sum(med.values())
    return {
        "num_seqs": num_seqs,
        "context": prompt_len + decode_steps,
        **{k: round(v, 4) for k, v in med.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="benchmarks/results/scheduler_overhead_cpu.json")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = [run_case(n, 1000, args.steps) for n in (64, 256)]
    result = {
        "benchmark": "scheduler_overhead",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} CPU, 1 thread, Python {platform.python_version()}",
        "cases": cases,
    }
    print(f"{'seqs':>5} {'ctx':>6} {'schedule':>9} {'prepare':>9} {'update':>9} {'total ms':>9}")
    for c in cases:
        times = " ".join(
            f"{c[k]:>9.3f}" for k in ("schedule_ms", "prepare_ms", "update_ms", "total_ms")
        )
        print(f"{c['num_seqs']:>5} {c['context']:>6} {times}")
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
