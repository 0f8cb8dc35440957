# A CPU worker beside a busy neighbour: starts `fleetlm serve` (the shipped model, one CPU worker)
# with a given torch thread count, times a 64-token streamed completion five times alone and five
# times while another process spins in a busy loop, and prints the end-to-end seconds and the
# median inter-token gap. docs/serving.md#cpu-workers has the figures.
#   python -m benchmarks.cpu_neighbour                 # serve's own choice of threads
#   python -m benchmarks.cpu_neighbour --threads 2     # torch's default on a 2-core machine
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "fleetlm-tiny-chat", "prompt": "The os module provides", "max_tokens": 64,
        "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one(base: str, key: str) -> tuple[float, float]:
    """(end-to-end seconds, median gap between chunks in seconds) of one request."""
    started, times = time.perf_counter(), []
    headers = {"Authorization": f"Bearer {key}"}
    url = base + "/v1/completions"
    with httpx.stream("POST", url, json=BODY, headers=headers, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    gaps = [b - a for a, b in pairwise(times)]
    return time.perf_counter() - started, statistics.median(gaps)


def _measure(base: str, key: str, label: str, n: int = 5) -> None:
    _one(base, key)  # warm
    runs = [_one(base, key) for _ in range(n)]
    e2e = " ".join(f"{s:.3f}" for s in sorted(r[0] for r in runs))
    gap_ms = statistics.median(r[1] for r in runs) * 1000
    print(f"{label}: e2e s {e2e} | median inter-token ms {gap_ms:.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=None, help="FLEETLM_TORCH_THREADS")
    args = parser.parse_args()
    port = _free_port()
    data = Path(tempfile.mkdtemp(prefix="fleetlm-neighbour-")) / "data"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env |= {"FLEETLM_PORT": str(port), "PYTHONPATH": str(ROOT)}
    if args.threads:
        env["FLEETLM_TORCH_THREADS"] = str(args.threads)
    log = open(data.parent / "serve.log", "w")  # noqa: SIM115 - the child writes to it
    serve = subprocess.Popen(
        [sys.executable, "-m", "fleetlm.cli", "serve", "--data-dir", str(data)],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        said = [line for line in (data.parent / "serve.log").read_text().splitlines()
                if "worker(s)" in line]  # fmt: skip
        print(*said, sep="\n")
        key = (data / "demo-key").read_text().strip()
        _measure(base, key, "alone")
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(1)
            _measure(base, key, "beside a spinning process")
        finally:
            spinner.kill()
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
