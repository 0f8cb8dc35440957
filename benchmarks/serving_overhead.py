# Serving overhead on CPU: what the API + Redis queues + per-step publishing + SSE add per
# output token over the bare engine, and how many concurrent streams one `fleetlm serve`
# sustains. The engine is the same in both (tiny model, same KV pool); the served run streams
# through a real `fleetlm serve` (embedded Redis + Postgres) with K concurrent clients.
#   python -m benchmarks.serving_overhead [--concurrency 1,8,32,64,128] [--max-tokens 64]
#       [--json benchmarks/results/serving_overhead_cpu.json]
# TPOT is (last token time - first token time) / (completion tokens - 1) per request, measured
# in the engine loop for the bare run and at the HTTP client for the served run.
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
NUM_KV_BLOCKS = 4096
PROMPT = "Benchmark prompt: describe the queue. " * 2


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def summarize(tpots: list[float], ttfts: list[float], tokens: int, wall: float) -> dict:
    return {
        "tpot_ms_p50": statistics.median(tpots) * 1e3,
        "tpot_ms_p95": pct(tpots, 0.95) * 1e3,
        "ttft_ms_p50": statistics.median(ttfts) * 1e3,
        "ttft_ms_p95": pct(ttfts, 0.95) * 1e3,
        "output_tokens_per_s": tokens / wall,
    }


def bare_engine(model: str, concurrency: int, max_tokens: int) -> dict:
    from engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model=model, device="cpu", num_kv_blocks=NUM_KV_BLOCKS))
    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=True
    )
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_request("warmup", prompt, params)
    while engine.has_unfinished():
        engine.step()
    start = time.perf_counter()
    for i in range(concurrency):
        engine.add_request(f"r{i}", prompt, params, cache_salt=i)  # no cross-request cache hits
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    while engine.has_unfinished():
        for d in engine.step():
            now = time.perf_counter()
            if d.new_token_ids:
                first.setdefault(d.request_id, now)
                last[d.request_id] = now
    wall = time.perf_counter() - start
    tpots = [(last[r] - first[r]) / (max_tokens - 1) for r in first]
    ttfts = [first[r] - start for r in first]
    return summarize(tpots, ttfts, concurrency * max_tokens, wall)


def start_serve(model: str, data_dir: Path) -> tuple[subprocess.Popen, str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        FLEETLM_PORT=str(port),
        FLEETLM_NUM_KV_BLOCKS=str(NUM_KV_BLOCKS),
        FLEETLM_DEVICE="cpu",
        FLEETLM_MAX_QUEUE_LEN="100000",
        PYTHONPATH=str(ROOT),
    )
    log = open(data_dir.parent / "serve.log", "w")  # noqa: SIM115 - the child writes to it
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetlm.cli", "serve", "--data-dir", str(data_dir), "--model",
         model],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/ready", timeout=2).status_code == 200:
                return proc, base, (data_dir / "demo-key").read_text().strip()
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    raise SystemExit("fleetlm serve did not become ready; see serve.log")


async def one_stream(client: httpx.AsyncClient, model: str, max_tokens: int, start: float):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = last = None
    usage = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content") is not None:
                now = time.perf_counter()
                if chunk["choices"][0]["delta"].get("role") is None:  # skip the role chunk
                    first = first or now
                    last = now
    n = usage["completion_tokens"]
    return (last - first) / max(n - 1, 1), first - start, n


async def served(base: str, key: str, model: str, concurrency: int, max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=concurrency + 8)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base, headers=headers, timeout=600, limits=limits
    ) as client:
        await one_stream(client, model, max_tokens, time.perf_counter())  # warm-up
        start = time.perf_counter()
        results = await asyncio.gather(
            *(one_stream(client, model, max_tokens, start) for _ in range(concurrency)),
            return_exceptions=True,
        )
        wall = time.perf_counter() - start
    ok = [r for r in results if not isinstance(r, BaseException)]
    errors = [repr(r) for r in results if isinstance(r, BaseException)]
    out = summarize([r[0] for r in ok], [r[1] for r in ok], sum(r[2] for r in ok), wall)
    out["errors"] = len(errors)
    out["first_error"] = errors[0] if errors else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--concurrency", default="1,8,32,64,128")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/serving_overhead_cpu.json"))
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, base, key = start_serve(args.model, Path(tmp) / "data")
        try:
            # Bare and served back to back per level, so both see the same machine load (the
            # idle server blocks on Redis meanwhile and costs next to nothing).
            for k in levels:
                s = asyncio.run(served(base, key, args.model, k, args.max_tokens))
                e = bare_engine(args.model, k, args.max_tokens)
                rows.append(
                    {
                        "concurrency": k,
                        "engine": e,
                        "served": s,
                        "overhead_ms_per_token_p50": s["tpot_ms_p50"] - e["tpot_ms_p50"],
                        "loadavg_1m": os.getloadavg()[0],
                    }
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            if any(row["served"]["errors"] for row in rows):
                print((Path(tmp) / "serve.log").read_text()[-3000:], file=sys.stderr)
    print(f"{'streams':>7} {'engine TPOT':>12} {'served TPOT p50/p95':>20} {'+/token':>8} "
          f"{'served TTFT p50':>15} {'tok/s served':>12} {'errors':>6}")  # fmt: skip
    for row in rows:
        e, s = row["engine"], row["served"]
        print(
            f"{row['concurrency']:>7} {e['tpot_ms_p50']:>10.2f}ms "
            f"{s['tpot_ms_p50']:>9.2f}/{s['tpot_ms_p95']:<7.2f}ms "
            f"{row['overhead_ms_per_token_p50']:>6.2f}ms {s['ttft_ms_p50']:>13.1f}ms "
            f"{s['output_tokens_per_s']:>12.0f} {s['errors']:>6}"
        )
    result = {
        "benchmark": "serving_overhead",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "model": args.model,
        "max_tokens": args.max_tokens,
        "rows": rows,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
