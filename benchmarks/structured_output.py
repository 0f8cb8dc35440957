# Constrained decoding's cost on the GPU (issue 38's targets): decode step time (TPOT) of N
# concurrent streams with a JSON schema on every request vs none, and the step gap other
# streams see while a new 100-property schema compiles (it compiles on the engine's grammar
# thread: no step should stall). Dummy-weight presets produce noise, so the schema's values
# are bounded enums: only the grammar keeps the output valid, and every step masks.
#   python -m benchmarks.structured_output --model llama-3.1-8b --streams 64 --max-tokens 256
from __future__ import annotations

import argparse
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


def decode_steps(llm: LLM, params: list[SamplingParams], prompt_len: int) -> list[float]:
    """Step wall times once every stream is decoding (prefill steps left out)."""
    engine = llm.engine
    for i, p in enumerate(params):
        engine.add_request(f"b{time.monotonic_ns()}-{i}", [100 + i] * prompt_len, p)
    times, decoding = [], False
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        decoding = decoding or engine.stats().num_waiting == 0
        if decoding:
            times.append(dt)
    return times[5:]  # the first decode steps still mix in the last prefills


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
    a = decode_steps(llm, plain, args.prompt_len)
    overlap = llm.engine.overlap
    synced_before = overlap.num_synced if overlap is not None else 0
    b = decode_steps(llm, constrained, args.prompt_len)
    # Overlapped scheduling: constrained steps should not wait for the previous step's commit
    # (their masks are filled while the next forward runs); this counts the ones that did.
    synced = overlap.num_synced - synced_before if overlap is not None else None
    # C: plain streams decoding; a request with a schema never seen arrives mid-run.
    engine = llm.engine
    for i, p in enumerate(plain):
        engine.add_request(f"c-{i}", [100 + i] * args.prompt_len, p)
    gaps = []
    for step in range(m - 20):
        if step == 30:
            fresh = SamplingParams(max_tokens=m, structured_output=schema(args.properties, "n"))
            engine.add_request("c-new-schema", [7] * args.prompt_len, fresh)
        t0 = time.perf_counter()
        engine.step()
        gaps.append(time.perf_counter() - t0)
    while engine.has_unfinished():
        engine.step()
    result = {
        "model": args.model,
        "streams": n,
        "tpot_plain_ms": 1e3 * statistics.median(a),
        "tpot_schema_ms": 1e3 * statistics.median(b),
        "ratio": statistics.median(b) / statistics.median(a),
        "overlapped": overlap is not None,
        "schema_steps_synced": synced,
        "step_median_ms_around_new_schema": 1e3 * statistics.median(gaps),
        "step_max_ms_around_new_schema": 1e3 * max(gaps[25:60]),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
