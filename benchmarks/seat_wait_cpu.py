# Admission's forecast against the first tokens of a seat-bound worker at twice its capacity, on
# the CPU: a real `fleetlm serve` (the shipped tiny model, one worker) held to SEATS running
# requests with a bigger model's step cost (Settings.emulate_step_cost_s), equal 60-token
# streams, 30 % flex, admission bound 0.8 s. Capacity is a closed loop of twice SEATS clients;
# then Poisson arrivals at twice its rate. Prints the admitted interactive requests' worst first
# tokens beside their forecasts (x-fleetlm-predicted-ttft) and the server's queue time, and
# writes JSON. The H200 question it stands in for: the 8B at 256 seats, whose worst first tokens
# waited ~1.8 s for a seat against forecasts of 0.4-0.7 s (docs/benchmarks.md#overload-issue-36).
#   .venv/bin/python -m benchmarks.seat_wait_cpu --json benchmarks/results/seat_wait_cpu.json
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import httpx

from fleetlm.bench.launcher import LaunchedServer

MODEL = "fleetlm-tiny-chat"  # the shipped model's served name
PROMPT = "Tell me about the sea."
OUTPUT_TOKENS = 60


@dataclass
class Stream:
    sent_at: float
    flex: bool
    status: int | None = None
    request_id: str | None = None
    predicted_ttft_s: float | None = None
    first_token_s: float | None = None
    finish_reason: str | None = None
    server_queue_s: float | None = None


def stream(base_url: str, key: str, http: httpx.Client, out: Stream) -> None:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": OUTPUT_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    if out.flex:
        body["service_tier"] = "flex"
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    with http.stream(
        "POST", base_url + "/completions", json=body, headers=headers, timeout=180
    ) as r:
        out.status, out.request_id = r.status_code, r.headers.get("x-request-id")
        if "x-fleetlm-predicted-ttft" in r.headers:
            out.predicted_ttft_s = float(r.headers["x-fleetlm-predicted-ttft"])
        if r.status_code != 200:
            r.read()
            return
        for line in r.iter_lines():
            data = line.removeprefix("data: ")
            if not line.startswith("data: ") or data == "[DONE]":
                continue
            for choice in json.loads(data).get("choices", []):
                if choice.get("text") and out.first_token_s is None:
                    out.first_token_s = time.monotonic() - started
                out.finish_reason = choice.get("finish_reason") or out.finish_reason


def closed_loop(server: LaunchedServer, clients: int, seconds: float) -> list[Stream]:
    done: list[Stream] = []
    stop = time.monotonic() + seconds

    def client(i: int, http: httpx.Client) -> None:
        n = 0
        while time.monotonic() < stop:
            out = Stream(time.monotonic(), flex=(i + n) % 10 >= 7)
            stream(server.base_url, server.api_key, http, out)
            done.append(out)
            n += 1

    with httpx.Client(limits=httpx.Limits(max_connections=256)) as http:
        threads = [threading.Thread(target=client, args=(i, http)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return done


def open_loop(server: LaunchedServer, rate: float, seconds: float, seed: int) -> list[Stream]:
    rng, sent, threads = random.Random(seed), [], []
    start, at = time.monotonic(), 0.0
    with httpx.Client(limits=httpx.Limits(max_connections=512)) as http:
        while (at := at + rng.expovariate(rate)) < seconds:
            while (now := time.monotonic()) < start + at:
                time.sleep(min(0.01, start + at - now))
            out = Stream(now, flex=rng.random() < 0.3)
            sent.append(out)
            args = (server.base_url, server.api_key, http, out)
            threads.append(threading.Thread(target=stream, args=args))
            threads[-1].start()
        for t in threads:
            t.join()
    return sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seats", type=int, default=8)
    ap.add_argument("--step-cost", default="[0.02, 0.001, 0.0]", help="emulate_step_cost_s")
    ap.add_argument("--seconds", type=float, default=30.0, help="of overload arrivals")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    env = {
        "FLEETLM_MAX_NUM_SEQS": str(args.seats),
        "FLEETLM_TPOT_TARGET_S": "1",  # the seats, not the TPOT rule, bound the running set
        "FLEETLM_EMULATE_STEP_COST_S": args.step_cost,
        "FLEETLM_MAX_QUEUE_WAIT_S": "0.8",
    }
    runs = []
    for run in range(args.runs):
        with LaunchedServer(None, env=env) as server:  # the shipped model
            closed_loop(server, args.seats, 10.0)  # the step prices get fitted
            capacity = closed_loop(server, 2 * args.seats, 20.0)
            rate = sum(1 for s in capacity if s.finish_reason == "length") / 20.0
            sent = open_loop(server, 2 * rate, args.seconds, seed=run)
            admitted = [s for s in sent if not s.flex and s.first_token_s is not None]
            timings = server.request_timings([s.request_id for s in admitted if s.request_id])
            for s in admitted:
                queue_ms = timings.get(s.request_id, (None, None))[0]
                s.server_queue_s = queue_ms / 1000 if queue_ms is not None else None
        worst = sorted(admitted, key=lambda s: s.first_token_s, reverse=True)[:8]
        result = {
            "capacity_req_s": rate,
            "offered_req_s": 2 * rate,
            "interactive_admitted": len(admitted),
            "interactive_refused": sum(1 for s in sent if not s.flex and s.status == 503),
            "flex_admitted": sum(1 for s in sent if s.flex and s.status == 200),
            "flex_refused": sum(1 for s in sent if s.flex and s.status == 503),
            "ttft_p50_s": statistics.median(s.first_token_s for s in admitted),
            "worst": [asdict(s) for s in worst],
        }
        runs.append(result)
        tail = ", ".join(
            f"{s.first_token_s:.2f} s ({s.predicted_ttft_s:.2f}, {s.server_queue_s or 0:.2f})"
            for s in worst[:4]
        )
        print(
            f"run {run}: capacity {rate:.2f} req/s, offered {2 * rate:.2f}; interactive "
            f"{len(admitted)} admitted, {result['interactive_refused']} refused; worst first "
            f"tokens (forecast, server queue): {tail}",
            flush=True,
        )
    if args.json:
        flags = [
            f"--{k.replace('_', '-')} {shlex.quote(str(v))}"
            for k, v in vars(args).items()
            if k != "json"
        ]
        doc = {
            "command": "python -m benchmarks.seat_wait_cpu " + " ".join(flags),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"host": platform.node(), "cpus": os.cpu_count()},
            "server_env": env,
            "runs": runs,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
