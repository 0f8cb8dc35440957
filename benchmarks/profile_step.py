# Where does a decode step's time go? cProfile over steady-state decode steps of a preset on
# the GPU, plus the GPU time of each step from CUDA events.
#   python benchmarks/profile_step.py [--model llama-3.1-8b] [--seqs 64] [--steps 100]
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from engine import EngineConfig, LLMEngine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prompt", type=int, default=500)
    args = ap.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, max_num_seqs=max(args.seqs, 8)))
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.steps + 50, ignore_eos=True)
    for i in range(args.seqs):
        engine.add_request(f"r{i}", [rng.randrange(vocab) for _ in range(args.prompt)], params)
    while any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.requests.values()
    ):
        engine.step()
    for _ in range(10):
        engine.step()
    engine.runner.step_events = []
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.steps):
        engine.step()
    prof.disable()
    wall = (time.perf_counter() - t0) / args.steps
    torch.cuda.synchronize()
    ev = engine.runner.step_events
    gpu = sum(a.elapsed_time(b) for a, b in ev) / len(ev)
    print(f"{args.model} decode at {args.seqs} seqs: wall {1e3 * wall:.2f} ms/step, "
          f"GPU {gpu:.2f} ms/step (events), graphs={engine.runner.graphs is not None}")  # fmt: skip
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(22)
        print(s.getvalue()[-5000:])


if __name__ == "__main__":
    main()
