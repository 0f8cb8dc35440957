# Constrained decoding's cost on the GPU (issue 38's targets): decode step time (TPOT) of N
# concurrent streams with a JSON schema on every request vs none, and the step gap other
# streams see while a new 100-property schema compiles (it compiles on the engine's grammar
# thread: no step should stall). Dummy-weight presets produce noise, so the schema's values
# are bounded enums: only the grammar keeps the output valid, and every step masks. Each run's
# `split_ms` is the median step from the engine's step trace: the host's parts (a constrained
# step's read_ahead: waiting for the previous step's ids; masks: filling and applying them)
# and, on CUDA, the GPU's busy time and the gap before each step (GPU idle: host-bound).
#   python -m benchmarks.structured_output --model llama-3.1-8b --streams 64 --max-tokens 256
from __future__ import annotations

import argparse
import bisect
import json
import statistics
import time

from engine import LLM, SamplingParams
from engine.sampling_params import StructuredOutput


def schema(num_properties: int, salt: str = "") -> StructuredOutput:
    props = {
        f"{salt}field_{i}": {"enum": ["alpha", "beta", "gamma", "delta"]}
        for i in range(num_properties)
    }
    body = {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}  # fmt: skip
    return StructuredOutput("json_schema", json.dumps(body))


SPLIT_FIELDS = ("schedule_s", "prepare_s", "forward_s", "read_ahead_s", "masks_s", "sample_s",
                "wait_s", "post_s", "gpu_s", "gpu_gap_s")  # fmt: skip


def decode_steps(
    llm: LLM, params: list[SamplingParams], prompt_len: int, split: dict | None = None
) -> list[float]:
    """Step wall times once every stream is decoding (prefill steps left out). `split`: filled
    with the median of each step-trace field over those steps, in ms."""
    engine = llm.engine
    for i, p in enumerate(params):
        engine.add_request(f"b{time.monotonic_ns()}-{i}", [100 + i] * prompt_len, p)
    trace = engine.enable_step_trace() if split is not None else None
    times, decoding, since = [], False, None
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        if not decoding and engine.stats().num_waiting == 0:
            decoding, since = True, time.time()
        if decoding:
            times.append(dt)
    if trace is not None:
        cols = trace.columns(since=since)
        engine.disable_step_trace()
        for name in SPLIT_FIELDS:
            values = [v for v in cols[name][5:] if v == v]  # (NaN: not measured on the CPU)
            split[name.removesuffix("_s") + "_ms"] = (
                round(1e3 * statistics.median(values), 3) if values else None
            )
    return times[5:]  # the first decode steps still mix in the last prefills


def slowest_step(cols: dict, rows_at: list[int], arrival: int | None) -> dict | None:
    """Run C's slowest step near the new schema's arrival, as the step trace split it (ms,
    plus its Triton compiles and batch shape): where a stall came from. rows_at[k]: the trace
    rows recorded before step k (a step may record none, or more than one)."""
    if arrival is None:
        return None
    first, last = max(arrival - 5, 0), min(arrival + 30, len(rows_at) - 1)
    rows = range(rows_at[first], rows_at[last])
    if not rows:
        return None
    i = max(rows, key=lambda r: cols["wall_s"][r])
    step = {name.removesuffix("_s") + "_ms": round(1e3 * cols[name][i], 3)
            for name in ("wall_s", *SPLIT_FIELDS) if cols[name][i] == cols[name][i]}  # fmt: skip
    for name in ("kernel_compiles", "num_tokens", "num_decodes", "num_seqs"):
        if name in cols and cols[name][i] == cols[name][i]:
            step[name] = int(cols[name][i])
    return {"step": bisect.bisect_right(rows_at, i) - 1, **step}


def new_schema_window(gaps: list[float], arrival: int | None) -> dict:
    """Run C's step times: the median over the run, the most from 5 steps before the new
    schema's arrival to 30 after. A run too short for an arrival has no such window: its
    maximum is None (not 0 ms: nothing was measured; rerun with a larger --max-tokens)."""
    first = max(arrival - 5, 0) if arrival is not None else 0
    window = gaps[first : arrival + 30] if arrival is not None else []
    result = {"step_median_ms_around_new_schema": 1e3 * statistics.median(gaps) if gaps else None}
    if not window:
        note = "none: the run was too short for a new schema to arrive"
        return {**result, "step_max_ms_around_new_schema": None, "new_schema_window": note}
    return {
        **result,
        "step_max_ms_around_new_schema": 1e3 * max(window),
        "new_schema_window": f"steps {first}-{first + len(window) - 1}, arrival at {arrival}",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--properties", type=int, default=100)
    args = ap.parse_args()
    llm = LLM(args.model, max_num_seqs=max(args.streams + 1, 8))
    n, m = args.streams, args.max_tokens
    plain = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=m, ignore_eos=True) for i in range(n)
    ]
    spec = schema(args.properties)
    llm.engine.grammars.check(spec)  # compiled once up front: run B measures masking only
    constrained = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=m, ignore_eos=True,
                       structured_output=spec)
        for i in range(n)
    ]  # fmt: skip
    decode_steps(llm, plain[:8], args.prompt_len)  # warm-up
    split_a, split_b = {}, {}
    a = decode_steps(llm, plain, args.prompt_len, split_a)
    overlap = llm.engine.overlap
    synced_before = overlap.num_synced if overlap is not None else 0
    b = decode_steps(llm, constrained, args.prompt_len, split_b)
    # Overlapped scheduling: constrained steps should not wait for the previous step's commit
    # (their masks are filled while the next forward runs); this counts the ones that did.
    synced = overlap.num_synced - synced_before if overlap is not None else None
    # C: plain streams decoding; a request with a schema never seen arrives mid-run.
    engine = llm.engine
    for i, p in enumerate(plain):
        engine.add_request(f"c-{i}", [100 + i] * args.prompt_len, p)
    trace = engine.enable_step_trace()
    gaps = []
    # The new schema arrives at step 30, or halfway through a shorter run (none in a run of
    # fewer than 2 steps: --max-tokens below 22).
    num_steps = max(m - 20, 0)
    arrival = min(30, num_steps // 2) if num_steps >= 2 else None
    rows_at = []
    for step in range(num_steps):
        rows_at.append(trace.num_recorded)
        if step == arrival:
            fresh = SamplingParams(max_tokens=m, structured_output=schema(args.properties, "n"))
            engine.add_request("c-new-schema", [7] * args.prompt_len, fresh)
        t0 = time.perf_counter()
        engine.step()
        gaps.append(time.perf_counter() - t0)
    while engine.has_unfinished():
        engine.step()
    rows_at.append(trace.num_recorded)
    slowest = slowest_step(trace.columns(), rows_at, arrival)
    engine.disable_step_trace()
    result = {
        "model": args.model,
        "streams": n,
        "tpot_plain_ms": 1e3 * statistics.median(a),
        "tpot_schema_ms": 1e3 * statistics.median(b),
        "ratio": statistics.median(b) / statistics.median(a),
        "overlapped": overlap is not None,
        "schema_steps_synced": synced,
        **new_schema_window(gaps, arrival),
        "slowest_step_around_new_schema": slowest,
        "split_plain_ms": split_a,
        "split_schema_ms": split_b,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
