# What a worker's per-step Redis round trip costs its loop at N running requests: the outbox's
# token deltas (one event per request), the cancel-flag MGET and the stats HSET, written into one
# pipeline and executed against a real (embedded) Redis, as workers/gpu/round_trip.py does. Prints
# and writes the build time (Python filling the pipeline) and the io time (packing, Redis, the
# replies), beside the same deltas sent as one XADD per request (how the outbox wrote them
# before PUBLISH_SCRIPT), so the figure says what the script saves.
#   python -m benchmarks.exchange_cost [--running 1,32,130,256] [--steps 300]
#       [--json benchmarks/results/exchange_cost_cpu.json]
# Host work only: no engine, no GPU. The loop's exchange_build_ms / exchange_io_ms in a served
# run's step trace are the same two quantities with the rest of the round trip included.
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import redis  # noqa: E402

from engine.outputs import RequestDelta, RequestUsage  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from service import streams as p  # noqa: E402
from service.embedded import EmbeddedServices  # noqa: E402
from service.events import encode_event  # noqa: E402
from service.queued_request import QueuedRequest  # noqa: E402
from service.settings import Settings  # noqa: E402
from workers.gpu.inflight import Inflight  # noqa: E402
from workers.gpu.outbox import Outbox  # noqa: E402
from workers.gpu.output_events import delta_event  # noqa: E402


def running_requests(n: int) -> dict[str, Inflight]:
    inflight = {}
    for i in range(n):
        req = QueuedRequest(
            request_id=f"cmpl-{i:032x}", tenant_id="t", key_id="k", model="m",
            endpoint="chat.completions", priority="interactive",
            prompt_token_ids=list(range(2000)), sampling=SamplingParams(), enqueued_at=time.time(),
        )  # fmt: skip
        queue = p.worker_queue_key("bench", "interactive")
        inflight[req.request_id] = Inflight(req, queue, f"{i + 1}-0", published=True, num_events=1)
    return inflight


def step_deltas(inflight: dict[str, Inflight], n: int) -> list[RequestDelta]:
    usage = RequestUsage(prompt_tokens=2000, cached_tokens=1200, completion_tokens=n, preemptions=0)
    return [
        RequestDelta(rid, [1234], " word", False, None, None, usage, 0.0, 0.0, 0.0, None)
        for rid in inflight
    ]


def one_round_trip(r, outbox: Outbox, inflight, step: int, per_xadd: bool) -> tuple[float, float]:
    outbox.deltas = step_deltas(inflight, step)
    t0 = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    if per_xadd:
        for d in outbox.deltas:
            f = inflight[d.request_id]
            pipe.xadd(p.output_key(d.request_id), encode_event(delta_event("bench", f, d)))
        outbox.deltas = []
        written = None
    else:
        written = outbox.write(pipe, inflight)
    pipe.mget([p.cancel_key(i) for i in inflight])
    pipe.hset(p.stats_key("bench"), mapping={f"field_{i}": i for i in range(24)})
    t1 = time.perf_counter()
    pipe.execute()
    t2 = time.perf_counter()
    if written is not None:
        outbox.confirm(written)
    return t1 - t0, t2 - t1


def measure(r, settings: Settings, n: int, steps: int, per_xadd: bool) -> dict:
    inflight = running_requests(n)
    outbox = Outbox("bench", settings)
    build, io = [], []
    for step in range(steps + 30):
        b, i = one_round_trip(r, outbox, inflight, step, per_xadd)
        if step >= 30:  # warm-up: connection, script cache
            build.append(b)
            io.append(i)
    r.delete(*(p.output_key(rid) for rid in inflight))
    ms = lambda xs: round(statistics.mean(xs) * 1e3, 3)  # noqa: E731
    p95 = lambda xs: round(sorted(xs)[int(0.95 * (len(xs) - 1))] * 1e3, 3)  # noqa: E731
    return {"build_ms": ms(build), "io_ms": ms(io), "total_ms": ms(build) + ms(io),
            "total_ms_p95": p95([a + b for a, b in zip(build, io, strict=True)])}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--running", default="1,32,130,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/exchange_cost_cpu.json"))
    args = ap.parse_args()
    services = EmbeddedServices(Path(tempfile.mkdtemp(prefix="fleetlm-exchange-")))
    services.start(redis=True, postgres=False)
    rows = []
    try:
        r = redis.Redis.from_url(services.redis_url)
        settings = Settings(_env_file=None)
        for n in (int(x) for x in args.running.split(",")):
            script = measure(r, settings, n, args.steps, per_xadd=False)
            per_xadd = measure(r, settings, n, args.steps, per_xadd=True)
            rows.append({"running": n, "publish_script": script, "xadd_per_request": per_xadd})
            print(
                f"{n:4d} running: script build {script['build_ms']:.2f} + io {script['io_ms']:.2f}"
                f" = {script['total_ms']:.2f} ms (p95 {script['total_ms_p95']:.2f});"
                f" one XADD each {per_xadd['build_ms']:.2f} + {per_xadd['io_ms']:.2f}"
                f" = {per_xadd['total_ms']:.2f} ms (p95 {per_xadd['total_ms_p95']:.2f})"
            )
    finally:
        services.stop()
    result = {
        "command": " ".join(["python", "-m", "benchmarks.exchange_cost", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, "
        f"Python {platform.python_version()}",
        "steps": args.steps,
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
