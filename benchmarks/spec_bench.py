# Speculative decoding benchmark: TPOT and output tok/s with and without speculation over a
# grid of acceptance rate × concurrency, for both proposers, and the batch size where
# speculation stops helping.
#
# Dummy weights make natural acceptance meaningless, so it is dialled in with an oracle. First
# the target's random weights are reshaped so that greedy decoding follows a fixed chain
# t → chain[t] by a wide logit margin (attention and MLP outputs scaled down 10⁴, the output
# head a permutation of the embedding): every kernel and matmul still runs at full size on
# ordinary numbers, but bf16 rounding can no longer flip an argmax between the decode and the
# verify kernels, so the greedy text is the same with and without speculation. A baseline run
# (no speculation) records each request's greedy continuation. In the speculative
# runs the real proposer still runs — the n-gram lookup on the host, or a real draft model
# (llama-3.2-1b for the 8B target: its own forward passes over every batch and its k
# autoregressive proposal passes) — so each step pays the proposer's true cost; its tokens are
# then replaced by the recorded continuation, each spoiled with probability c. With k drafts
# per step the expected acceptance is (1/k)·Σ_{j=1..k} (1-c)^j; c is solved for each target
# rate; the measured rate is reported beside it.
#
# Two policies per proposer: "fixed" drafts k tokens for every decode whatever the batch (the
# raw cost/benefit surface the thresholds are set from), "policy" is the shipped adaptive rule
# (spec/policy.py, default thresholds), which must get out of the way where "fixed" loses.
#
#   python -m benchmarks.spec_bench          # H200: llama-3.1-8b (+ llama-3.2-1b draft)
#   python -m benchmarks.spec_bench --smoke  # CPU: tiny preset, seconds
from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.config import EngineConfig
from engine.core.request import Request
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


class OracleProposer:
    """Wraps a real proposer: runs it (its cost), then replaces its drafts with the recorded
    greedy continuation, each token spoiled with probability corrupt_fraction."""

    def __init__(self, inner, vocab: int, seed: int = 0) -> None:
        self.inner = inner
        self.per_step_cost = getattr(inner, "per_step_cost", False)
        self.vocab = vocab
        self.trajectories: dict[tuple[int, ...], list[int]] = {}  # prompt → greedy output
        self.corrupt_fraction = 0.0
        self._rng = np.random.default_rng(seed)
        self._live: dict[str, list[int] | None] = {}  # request id → trajectory; None: diverged

    def reset(self) -> None:
        self._live.clear()

    def _trajectory(self, r: Request) -> list[int] | None:
        if r.request_id not in self._live:
            key = tuple(r.token_ids[: r.num_prompt_tokens])
            self._live[r.request_id] = self.trajectories.get(key)
        traj = self._live[r.request_id]
        n = r.num_output_tokens
        # Checking the newest token is enough: after a divergence the next token compared
        # would match the record only by chance, and the first mismatch retires the record.
        if traj is not None and n and (n > len(traj) or traj[n - 1] != r.token_ids[-1]):
            traj = self._live[r.request_id] = None
        return traj

    def _fill(self, requests: list[Request], slots: list[int]) -> None:
        # Random draws for the whole batch at once: the oracle's own host cost stays far below
        # a real proposer's, so the figures are the engine's.
        n, k, vocab = len(requests), max(slots), self.vocab
        spoil = self._rng.random((n, k)) < self.corrupt_fraction
        shift = self._rng.integers(1, vocab, (n, k))
        filler = self._rng.integers(0, vocab, (n, k))
        for i, (r, s) in enumerate(zip(requests, slots)):
            traj = self._trajectory(r)
            m = r.num_output_tokens
            drafts = traj[m : m + s] if traj is not None else []
            if len(drafts) < s:  # diverged or past the record: drafts that will be rejected
                drafts = drafts + filler[i, len(drafts) : s].tolist()
            if spoil[i, :s].any():
                drafts = [(t + int(d)) % vocab if bad else t
                          for t, bad, d in zip(drafts, spoil[i], shift[i])]  # fmt: skip
            r.spec_token_ids = drafts
            r.spec_slots = s
            r.spec_draft_probs = None  # greedy runs: drafts verify as point masses

    def plan(self, requests: list[Request]) -> None:
        slots = [r.spec_slots for r in requests]
        self.inner.plan(requests)  # n-gram: proposes (and may shrink slots); draft: nothing
        if getattr(self.inner, "needs_slots_first", True) is False:
            self._fill(requests, slots)

    def propose(self, requests: list[Request]) -> None:
        self.inner.propose(requests)  # draft model: k real passes
        if getattr(self.inner, "needs_slots_first", True) is not False:
            self._fill(requests, [r.spec_slots for r in requests])


def make_greedy_chain(model, seed: int = 0) -> None:
    """Reshape random weights so greedy decoding follows t → chain[t] by a wide margin."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(1e-4)
            layer.mlp.down_proj.weight.mul_(1e-4)
        # The residual stream is now ~the embedding e_t; head row j = e_perm[j] makes
        # logit j largest where perm[j] == t.
        embed = model.model.embed_tokens.weight
        gen = torch.Generator().manual_seed(seed)
        perm = torch.randperm(embed.shape[0], generator=gen).to(embed.device)
        model.lm_head.weight.copy_(embed[perm])


def workload(concurrency: int, args, vocab: int, out_len: int | None = None):
    rng = random.Random(concurrency)
    return [
        BenchRequest(
            prompt_ids=[rng.randrange(vocab) for _ in range(args.prompt_len)],
            max_tokens=out_len or args.out_len,
            priority="interactive",
            arrival_s=0.0,
        )
        for _ in range(concurrency)
    ]


def record_outputs(engine: LLMEngine, requests: list[BenchRequest]) -> tuple[dict, dict]:
    """Run the baseline, returning (its figures, prompt → greedy output)."""
    prompts: dict[str, tuple[int, ...]] = {}
    outputs: dict[str, list[int]] = {}
    add, step = engine.add_request, engine.step

    def add_request(request_id, prompt_ids, *a, **kw):
        prompts[request_id] = tuple(prompt_ids)
        outputs[request_id] = []
        return add(request_id, prompt_ids, *a, **kw)

    def recording_step():
        deltas = step()
        for d in deltas:
            outputs[d.request_id].extend(d.new_token_ids)
        return deltas

    engine.add_request, engine.step = add_request, recording_step
    try:
        result = run_workload(engine, requests, detokenize=False)
    finally:
        del engine.add_request, engine.step
    return result, {prompts[rid]: out for rid, out in outputs.items()}


def figures(result: dict, s0, s1) -> dict:
    drafts = s1.spec_decode_num_draft_tokens - s0.spec_decode_num_draft_tokens
    accepted = s1.spec_decode_num_accepted_tokens - s0.spec_decode_num_accepted_tokens
    return {
        "tpot_p50_ms": 1e3 * result["tpot_s"]["p50"],
        "tpot_p95_ms": 1e3 * result["tpot_s"]["p95"],
        "ttft_p50_ms": 1e3 * result["ttft_s"]["p50"],
        "output_tok_s": result["output_tok_s"],
        "steps": result["steps"],
        "mean_step_ms": result["mean_step_ms"],
        "gpu_idle_fraction": result.get("gpu_idle_fraction"),
        "draft_tokens": drafts,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafts if drafts else None,
        "unexpected_finishes": result["unexpected_finishes"],
    }


def build(args, method: str | None) -> LLMEngine:
    max_seqs = max(args.concurrency)
    options = dict(
        model=args.model,
        device=args.device,
        max_num_seqs=max_seqs,
        max_model_len=args.prompt_len + args.out_len + 32,
        max_num_batched_tokens=max(args.budget, max_seqs * (args.k + 1)),
        num_speculative_tokens=args.k,
    )
    if args.num_kv_blocks:
        options["num_kv_blocks"] = args.num_kv_blocks
    if method is not None:
        options["speculative_method"] = method
    if method == "draft":
        options["draft_model"] = args.draft_model
    engine = LLMEngine(EngineConfig(**options))
    make_greedy_chain(engine.runner.model)  # graphs read the weights in place: no re-capture
    return engine


def set_policy(engine: LLMEngine, policy: str, defaults: EngineConfig) -> None:
    spec = engine.speculator
    if policy == "fixed":  # k drafts for every decode, no batch gate, no acceptance cut-off
        spec.max_batch_size, spec.min_acceptance = 10**9, 0.0
        spec.num_drafts_for = lambda r, k, _: max(0, min(k, r.max_tokens - r.num_output_tokens - 1))
    else:
        spec.max_batch_size = defaults.spec_max_batch_size
        spec.min_acceptance = defaults.spec_min_acceptance
        spec.__dict__.pop("num_drafts_for", None)


def sweep(engine: LLMEngine, oracle: OracleProposer, method: str, args, vocab, baseline):
    rows = []
    # The shipped defaults for this proposer (spec_min_acceptance depends on the method).
    draft = args.draft_model if method == "draft" else None
    defaults = EngineConfig(model=args.model, speculative_method=method, draft_model=draft)
    for policy in args.policies:
        set_policy(engine, policy, defaults)
        targets = args.acceptance if policy == "fixed" else args.policy_acceptance
        for target in targets:
            oracle.corrupt_fraction = corrupt_fraction_for(target, args.k)
            for c in args.concurrency:
                oracle.reset()
                s0 = engine.stats()
                r = figures(run_workload(engine, workload(c, args, vocab), detokenize=False),
                            s0, engine.stats())  # fmt: skip
                b = baseline[c]
                row = {
                    "proposer": method,
                    "policy": policy,
                    "target_acceptance": target,
                    "corrupt_fraction": oracle.corrupt_fraction,
                    "concurrency": c,
                    "baseline": b,
                    "speculative": r,
                    "tpot_speedup": b["tpot_p50_ms"] / r["tpot_p50_ms"],
                    "throughput_speedup": r["output_tok_s"] / b["output_tok_s"],
                }
                rows.append(row)
                meas = r["acceptance"] if r["acceptance"] is not None else float("nan")
                print(
                    f"{method:>6} {policy:>6} {target:>5.2f} {meas:>5.2f} {c:>5} "
                    f"{b['tpot_p50_ms']:>8.2f} {r['tpot_p50_ms']:>8.2f} "
                    f"{b['output_tok_s']:>9.1f} {r['output_tok_s']:>9.1f} "
                    f"{row['tpot_speedup']:>6.2f}x {row['throughput_speedup']:>6.2f}x",
                    flush=True,
                )
    return rows


def warm_up(engine: LLMEngine, args, vocab: int) -> None:
    # Triton compiles and CUDA-graph paths for every batch size measured, off the clock.
    for c in args.concurrency:
        run_workload(engine, workload(c, args, vocab, out_len=8), detokenize=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--draft-model", default="llama-3.2-1b")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--proposers", default="ngram,draft")
    parser.add_argument("--policies", default="fixed,policy")
    parser.add_argument("--concurrency", default="1,8,64,256")
    parser.add_argument("--acceptance", default="0.3,0.6,0.9")
    parser.add_argument("--policy-acceptance", default="0.6")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--out-len", type=int, default=256)
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--num-kv-blocks", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/spec_decode.json")
    parser.add_argument("--smoke", action="store_true", help="tiny preset on the CPU")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.draft_model, args.device, args.concurrency = "tiny", "tiny", "cpu", "1,4"
        args.prompt_len, args.out_len, args.num_kv_blocks = 32, 24, 256
        args.out = str(Path(tempfile.gettempdir()) / "spec_decode_smoke.json")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.acceptance = [float(a) for a in args.acceptance.split(",")]
    args.policy_acceptance = [float(a) for a in args.policy_acceptance.split(",")]
    args.policies = args.policies.split(",")

    t0 = time.time()
    print(
        f"{args.model} (draft {args.draft_model}) on {args.device}, k={args.k}, "
        f"prompt {args.prompt_len}, output {args.out_len}\n"
        f"{'prop':>6} {'policy':>6} {'acc':>5} {'meas':>5} {'conc':>5} {'TPOT b':>8} "
        f"{'TPOT s':>8} {'tok/s b':>9} {'tok/s s':>9} {'TPOT×':>7} {'tok/s×':>7}",
        flush=True,
    )
    rows: list[dict] = []
    baseline: dict[int, dict] = {}
    trajectories: dict = {}
    for method in args.proposers.split(","):
        engine = build(args, method)
        vocab = engine.model_config.vocab_size
        speculator = engine.speculator
        if not baseline:  # the baseline runs on the first engine with speculation off
            engine.speculator = None
            warm_up(engine, args, vocab)
            for c in args.concurrency:
                s0 = engine.stats()
                result, outputs = record_outputs(engine, workload(c, args, vocab))
                baseline[c] = figures(result, s0, engine.stats())
                trajectories |= outputs
            engine.speculator = speculator
        oracle = OracleProposer(speculator.proposer, vocab)
        oracle.trajectories = trajectories
        speculator.proposer = oracle
        set_policy(engine, "fixed", engine.config)
        warm_up(engine, args, vocab)
        rows += sweep(engine, oracle, method, args, vocab, baseline)
        del engine, speculator, oracle
        gc.collect()
        if args.device != "cpu":
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # Per (proposer, acceptance) under the fixed policy: the smallest measured batch size where
    # speculation no longer raises output tok/s (None: it helped at every size measured).
    crossover: dict[str, int | None] = {}
    for r in rows:
        key = f"{r['proposer']}@{r['target_acceptance']}"
        if r["policy"] != "fixed":
            continue
        crossover.setdefault(key, None)
        if r["throughput_speedup"] < 1.0 and (
            crossover[key] is None or r["concurrency"] < crossover[key]
        ):
            crossover[key] = r["concurrency"]
    print(f"speculation stops helping (tok/s) at concurrency: {crossover}")

    out = {
        "model": args.model,
        "draft_model": args.draft_model,
        "device": args.device,
        "k": args.k,
        "prompt_len": args.prompt_len,
        "out_len": args.out_len,
        "concurrency": args.concurrency,
        "baseline": {str(c): b for c, b in baseline.items()},
        "rows": rows,
        "crossover_concurrency": crossover,
        "wall_s": time.time() - t0,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path} in {out['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
