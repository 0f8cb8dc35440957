# Host cost of constrained decoding per step (issue 38), on the CPU: the bare engine with the
# overlapped step on, 64 streams with the Llama 3 vocabulary (128,256 ids) on a tiny random-weight
# model, with and without benchmarks.structured_output's 100-property schema. The forward pass
# and the sampler run on the CPU here, so only the host parts are meaningful: each is timed by
# wrapping the engine's own functions (inclusive times, per step). On the GPU every one of them
# except `forward` and `sample` is host work in the critical path of a constrained step: the
# host reads step N's ids, then fills N+1's masks, commits N, schedules and packs N+2, all
# while N+1's forward runs (engine/runner/overlap.py); more than one forward's time and the GPU
# idles. `fill_par` is also measured alone (llguidance's pool against one row at a time), since
# it scales with the host's cores and this machine has few, and once more while another Python
# thread runs (it then waits for the interpreter lock).
#   python -m benchmarks.grammar_host [--streams 64] [--steps 40] [--json PATH]
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime

import numpy as np
import torch

from benchmarks.structured_output import schema
from engine import LLM, SamplingParams
from engine.core.scheduler import Scheduler
from engine.models.config import PRESETS
from engine.runner import overlap as overlap_module
from engine.runner.batch_builder import BatchBuilder
from engine.runner.model_runner import ModelRunner
from engine.runner.overlap import OverlapSteps
from engine.sampling import grammar_mask
from engine.sampling.grammar_mask import GrammarMasks, GrammarState

# The tiny preset's layers with the Llama 3.x vocabulary and special ids: its byte tokenizer
# (engine/tokenizer.py ByteTokenizer) is the one the 8B preset's benchmark runs with.
MODEL = "llama3-vocab-tiny"
LLAMA3 = PRESETS["llama-3.1-8b"]

# (where, attribute, name): the parts of a step, timed inclusively.
PARTS = (
    (Scheduler, "schedule", "schedule"),
    (BatchBuilder, "pack", "pack"),
    (ModelRunner, "_logits", "forward"),
    (overlap_module, "new_tokens_delta", "detokenize"),
    (OverlapSteps, "commit", "commit"),
    (OverlapSteps, "read_grammar_tokens", "read_ahead"),
    (GrammarState, "consume_ahead", "consume_ahead"),
    (GrammarState, "catch_up", "catch_up"),
    (GrammarState, "completed", "completed"),
    (GrammarMasks, "fill", "fill"),
    (grammar_mask, "fill_next_token_bitmask_par", "fill_par"),
    (GrammarMasks, "apply", "apply"),
)
GRAMMAR_PARTS = ("read_ahead", "fill", "apply", "completed")  # what a schema adds (disjoint)


def register_model() -> None:
    PRESETS.setdefault(
        MODEL,
        PRESETS["tiny"].with_overrides(
            vocab_size=LLAMA3.vocab_size, bos_token_id=LLAMA3.bos_token_id,
            eos_token_ids=LLAMA3.eos_token_ids, name=MODEL,
        ),
    )  # fmt: skip


@contextmanager
def timed_parts(totals: dict[str, float]):
    """Wraps every PARTS function to add its wall time to totals[name]; restores them."""
    saved = []
    for owner, attr, name in PARTS:
        original = owner.__dict__[attr]
        func = original.__func__ if isinstance(original, staticmethod) else original

        def wrapper(*args, _func=func, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _func(*args, **kwargs)
            finally:
                totals[_name] = totals.get(_name, 0.0) + time.perf_counter() - t0

        setattr(
            owner, attr, staticmethod(wrapper) if isinstance(original, staticmethod) else wrapper
        )
        saved.append((owner, attr, original))
    try:
        yield totals
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def run_steps(llm: LLM, params: list[SamplingParams], prompt_len: int, steps: int) -> dict:
    """Per-step milliseconds of each part over `steps` decode steps of every stream."""
    engine = llm.engine
    for i, p in enumerate(params):
        engine.add_request(f"g{time.monotonic_ns()}-{i}", [100 + i] * prompt_len, p)
    while engine.stats().num_running < len(params) or engine.stats().num_waiting:
        engine.step()  # admission (constrained: once the matcher is made) and prefill
    for _ in range(3):
        engine.step()  # the first decode steps
    totals: dict[str, float] = {}
    walls = []
    with timed_parts(totals):
        for _ in range(steps):
            t0 = time.perf_counter()
            engine.step()
            walls.append(time.perf_counter() - t0)
    while engine.has_unfinished():
        engine.step()
    parts = {name: round(1e3 * totals.get(name, 0.0) / steps, 4) for _, _, name in PARTS}
    grammar = sum(parts[name] for name in GRAMMAR_PARTS)
    return {"step_median_ms": round(1e3 * statistics.median(walls), 3), "parts_ms": parts,
            "grammar_host_ms": round(grammar, 4)}  # fmt: skip


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def fill_scaling(llm: LLM, streams: int, properties: int, steps: int) -> dict:
    """llguidance alone: one row at a time against its pool, over `steps` steps of `streams`
    matchers advancing by the first allowed token of their masks."""
    from llguidance import LLExecutor
    from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par

    compiler = llm.engine.grammars
    spec = schema(properties)
    matchers = [compiler.matcher(spec) for _ in range(streams)]
    words = (compiler.tokenizer.vocab_size + 31) // 32
    masks = np.zeros((streams, words), dtype=np.int32)
    executor = LLExecutor()
    one_row, pooled = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        for i, m in enumerate(matchers):
            fill_next_token_bitmask(m, masks, i)
        t1 = time.perf_counter()
        fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], masks)
        t2 = time.perf_counter()
        one_row.append((t1 - t0) / streams)
        pooled.append(t2 - t1)
        for i, m in enumerate(matchers):
            bits = np.unpackbits(masks[i].view(np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits)
            m.consume_tokens([int(allowed[(step * 7 + i) % len(allowed)])])
    # The same pool fill while another Python thread runs (a worker's exchange thread, say):
    # llguidance's call contends for the interpreter lock.
    busy, stop = [], threading.Event()
    spinner = threading.Thread(target=_spin, args=(stop,), daemon=True)
    spinner.start()
    for _ in range(min(steps, 10)):
        t0 = time.perf_counter()
        fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], masks)
        busy.append(time.perf_counter() - t0)
    stop.set()
    spinner.join()
    return {
        "streams": streams,
        "pool_all_rows_python_thread_busy_median_ms": round(1e3 * statistics.median(busy), 3),
        "one_row_median_ms": round(1e3 * statistics.median(one_row), 4),
        "one_row_mean_ms": round(1e3 * statistics.fmean(one_row), 4),
        "pool_all_rows_median_ms": round(1e3 * statistics.median(pooled), 3),
        "cpu_count": os.cpu_count(),  # llguidance's pool: 80 % of the CPUs it sees, up to 32
        "cpu_affinity": len(os.sched_getaffinity(0)),
    }


def fill_by_vocab(properties: int, steps: int, sizes=(8192, 32768, 128256)) -> dict:
    """One matcher's mask, one row at a time, on the byte tokenizer at several vocabulary sizes
    (its ids past the bytes are single characters: llguidance walks every one of them)."""
    from llguidance.numpy import fill_next_token_bitmask

    from engine.grammar import GrammarCompiler
    from engine.tokenizer import ByteTokenizer

    result = {}
    for vocab in sizes:
        eos = (vocab - 1,)
        matcher = GrammarCompiler(ByteTokenizer(vocab, None, eos), vocab, eos).matcher(
            schema(properties)
        )
        mask = np.zeros((1, (vocab + 31) // 32), dtype=np.int32)
        times = []
        for step in range(steps):
            t0 = time.perf_counter()
            fill_next_token_bitmask(matcher, mask, 0)
            times.append(time.perf_counter() - t0)
            allowed = np.flatnonzero(np.unpackbits(mask[0].view(np.uint8), bitorder="little"))
            matcher.consume_tokens([int(allowed[step % len(allowed)])])
        result[str(vocab)] = round(1e3 * statistics.median(times), 4)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--properties", type=int, default=100)
    ap.add_argument("--json", default="benchmarks/results/grammar_host_cpu.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    register_model()
    llm = LLM(MODEL, max_num_seqs=max(args.streams + 1, 8), overlap_scheduling=True)
    spec = schema(args.properties)
    llm.engine.grammars.check(spec)  # compiled up front: the runs measure masking only
    max_tokens = args.steps + 16

    def params(structured):
        return [
            SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                           structured_output=structured)
            for _ in range(args.streams)
        ]  # fmt: skip

    run_steps(llm, params(spec)[:4], args.prompt_len, 4)  # warm-up (masks, buffers)
    plain = run_steps(llm, params(None), args.prompt_len, args.steps)
    constrained = run_steps(llm, params(spec), args.prompt_len, args.steps)
    result = {
        "benchmark": "grammar_host",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} CPU, Python {platform.python_version()}",
        "vocab_size": LLAMA3.vocab_size,
        "streams": args.streams,
        "steps": args.steps,
        "plain": plain,
        "schema": constrained,
        "fill_scaling": fill_scaling(llm, args.streams, args.properties, min(args.steps, 40)),
        "one_row_ms_by_vocab": fill_by_vocab(args.properties, max(args.steps, 20)),
    }
    print(f"{'part (ms per step)':<20} {'plain':>9} {'schema':>9}")
    for _, _, name in PARTS:
        print(f"{name:<20} {plain['parts_ms'][name]:>9.3f} {constrained['parts_ms'][name]:>9.3f}")
    print(f"{'grammar host total':<20} {'':>9} {constrained['grammar_host_ms']:>9.3f}")
    print(json.dumps(result["fill_scaling"]))
    print("one row's mask (ms) by vocabulary size:", json.dumps(result["one_row_ms_by_vocab"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


if __name__ == "__main__":
    main()
