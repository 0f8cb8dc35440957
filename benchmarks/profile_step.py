# Where does a step's time go? cProfile over steady-state decode steps of a preset on the GPU,
# plus the GPU time of each step from CUDA events. --mixed N: every step also carries a new
# N-token prompt (a mixed step: piecewise graphs around eager attention up to 2,048 tokens).
#   python -m benchmarks.profile_step [--model llama-3.1-8b] [--seqs 64] [--steps 100]
#   python -m benchmarks.profile_step --seqs 96 --mixed 512
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import time

import torch

from engine import EngineConfig, LLMEngine, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--mixed", type=int, default=0, help="a new prompt of this many tokens a step")
    args = ap.parse_args()
    # Seats for the mixed steps' prompts beside the decodes (else they would only queue).
    seats = args.seqs + (8 if args.mixed else 0)
    engine = LLMEngine(EngineConfig(model=args.model, max_num_seqs=max(seats, 8)))
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
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def add_prompt(n: int) -> None:
        if args.mixed:
            prompt = [rng.randrange(vocab) for _ in range(args.mixed)]
            engine.add_request(f"m{n}", prompt, one)

    for n in range(5):  # warm: compiles the mixed steps' kernels
        add_prompt(-1 - n)
        engine.step()
    torch.cuda.synchronize()
    trace = engine.enable_step_trace()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for n in range(args.steps):
        add_prompt(n)
        engine.step()
    prof.disable()
    wall = (time.perf_counter() - t0) / args.steps
    cols = trace.columns()
    ms = {k: 1e3 * float(cols[k].mean()) for k in ("forward_s", "host_s", "gpu_s", "gpu_gap_s")}
    kind = f"decode + a {args.mixed}-token prompt" if args.mixed else "decode"
    print(f"{args.model} {kind} at {args.seqs} seqs: wall {1e3 * wall:.2f} ms/step, "
          f"host forward {ms['forward_s']:.2f}, host {ms['host_s']:.2f}, GPU {ms['gpu_s']:.2f}, "
          f"GPU idle between steps {ms['gpu_gap_s']:.2f} ms/step (means), "
          f"graphs={engine.runner.graphs is not None}")  # fmt: skip
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(22)
        print(s.getvalue()[-5000:])


if __name__ == "__main__":
    main()
