# Fault scenarios on a real `fleetlm serve` (embedded Redis + Postgres, CPU workers): the tests
# stop, kill and restart the actual processes and check what every client saw against what was
# billed. Timings are shortened through settings so each scenario takes seconds, not minutes;
# waits are on conditions with generous bounds.
from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from service.events import decode_event
from service.output_stream import follow
from tests.e2e.conftest import Server, start_server
from tests.waiting import wait_until

HEARTBEAT_S = 0.5
DEAD_AFTER_S = 3.0
NO_WORKER_TIMEOUT_S = 3.0
RELAY_POLL_S = 0.25
KEEPALIVE_S = 1.0
REDIS_TIMEOUT_S = 1.0
# No client waits longer than this without an SSE line (Settings.liveness_bound_s), with slack
# for a loaded 2-core machine.
LIVENESS_BOUND_S = DEAD_AFTER_S + NO_WORKER_TIMEOUT_S + RELAY_POLL_S
SLACK_S = 3.0

FAULT_ENV = {
    "FLEETLM_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
    "FLEETLM_WORKER_DEAD_AFTER_S": str(DEAD_AFTER_S),
    "FLEETLM_NO_WORKER_TIMEOUT_S": str(NO_WORKER_TIMEOUT_S),
    "FLEETLM_RELAY_POLL_S": str(RELAY_POLL_S),
    "FLEETLM_SSE_KEEPALIVE_S": str(KEEPALIVE_S),
    "FLEETLM_REDIS_TIMEOUT_S": str(REDIS_TIMEOUT_S),
    "FLEETLM_REDIS_OUTAGE_S": "25",
    "FLEETLM_DATABASE_TIMEOUT_S": "1",
    "FLEETLM_METERING_RETRY_S": "0.5",
    "FLEETLM_DRAIN_TIMEOUT_S": "4",
    "FLEETLM_MAX_QUEUE_WAIT_S": "30",
    "FLEETLM_BATCH_MAX_QUEUE_WAIT_S": "30",
}
PROMPT = "The quick brown fox jumps over the lazy dog"


def fault_server(tmp_path_factory, name: str, *, workers: int | None, **env: str) -> Server:
    return start_server(
        tmp_path_factory.mktemp(name) / "data", workers=workers, env=FAULT_ENV | env
    )


@pytest.fixture(scope="package")
def fleet(tmp_path_factory):
    """One `fleetlm serve --workers 0` and two `fleetlm worker` processes of its own, shared by
    the scenarios that leave it healthy."""
    srv = fault_server(tmp_path_factory, "faults", workers=0)
    for _ in range(2):
        srv.start_worker()
    wait_until(lambda: len(srv.workers_stats()) == 2, 120, "two live workers", 0.2)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"fleetlm serve exited {rc} on SIGTERM:\n{srv.log()}"


def ensure_workers(server: Server, n: int) -> None:
    server.workers = [w for w in server.workers if w.poll() is None]
    while len(server.workers) < n:
        server.start_worker()
    wait_until(lambda: len(server.workers_stats()) >= n, 120, f"{n} live workers", 0.2)


# -- clients ----------------------------------------------------------------------------------


@dataclass
class StreamLog:
    """What one streaming client saw, line by line."""

    status: int | None = None
    headers: dict = field(default_factory=dict)
    request_id: str | None = None
    text: str = ""
    times: list[float] = field(default_factory=list)  # monotonic time of each SSE line
    kinds: list[str] = field(default_factory=list)  # chunk | keepalive | error | done
    finish_reason: str | None = None
    error: dict | None = None
    body: dict | None = None  # a refusal's JSON body
    usage: dict | None = None  # the last usage a chunk carried
    exception: str | None = None
    started: float = 0.0

    @property
    def ended_properly(self) -> bool:
        """[DONE] last, after a finish_reason or an error event."""
        return (
            bool(self.kinds)
            and self.kinds[-1] == "done"
            and (self.finish_reason is not None or self.error is not None)
        )

    @property
    def num_chunks(self) -> int:
        return self.kinds.count("chunk")

    def max_gap_s(self, until: float | None = None) -> float:
        stamps = [self.started, *self.times]
        if until is not None and (not self.kinds or self.kinds[-1] != "done"):
            stamps.append(until)
        return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)


def completion_body(max_tokens: int, *, stream: bool = True, **extra) -> dict:
    body = {
        "model": "tiny",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    return body | extra


def complete(server: Server, body: dict, *, key: str | None = None, timeout_s: float = 60):
    """A non-streaming /v1/completions; the response, with `elapsed_s` (wall seconds)."""
    started = time.monotonic()
    r = httpx.post(
        server.base_url + "/v1/completions",
        json=body | {"stream": False},
        headers={"Authorization": f"Bearer {key or server.key}"},
        timeout=timeout_s,
    )
    r.elapsed_s = time.monotonic() - started
    return r


def stream_completion(
    server: Server,
    body: dict,
    log: StreamLog,
    *,
    key: str | None = None,
    hang_up_after: int | None = None,
    timeout_s: float = 120,
) -> StreamLog:
    """Streams /v1/completions into `log`; hangs up after `hang_up_after` content chunks."""
    headers = {"Authorization": f"Bearer {key or server.key}"}
    log.started = time.monotonic()
    try:
        with httpx.stream(
            "POST",
            server.base_url + "/v1/completions",
            json=body,
            headers=headers,
            timeout=timeout_s,
        ) as r:
            log.status, log.headers = r.status_code, dict(r.headers)
            log.request_id = r.headers.get("x-request-id")
            if r.status_code != 200:
                log.body = json.loads(r.read())
                return log
            for line in r.iter_lines():
                if not line:
                    continue
                log.times.append(time.monotonic())
                if line.startswith(":"):
                    log.kinds.append("keepalive")
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    log.kinds.append("done")
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    log.kinds.append("error")
                    log.error = chunk["error"]
                    continue
                log.kinds.append("chunk")
                log.usage = chunk.get("usage") or log.usage
                for choice in chunk.get("choices", []):
                    log.text += choice.get("text") or ""
                    log.finish_reason = choice.get("finish_reason") or log.finish_reason
                if hang_up_after is not None and log.num_chunks >= hang_up_after:
                    return log
    except Exception as exc:  # asserted on by the tests
        log.exception = repr(exc)
    return log


def hang_up(server: Server, body: dict, log: StreamLog, after: int) -> StreamLog:
    """A client that hangs up after `after` content chunks, as a plain socket: before closing it
    takes in whatever already reached it (a browser tab that closes has received those bytes),
    so `log` holds everything delivered to the client, not only what it had parsed so far."""
    payload = json.dumps(body).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {server.key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload
    log.started = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += sock.recv(65536)
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        log.status = int(lines[0].split()[1])
        log.headers = dict(line.split(": ", 1) for line in lines[1:])
        log.request_id = log.headers.get("x-request-id")
        done = False
        while not done:
            data = sock.recv(65536)
            if not data:
                break
            buf += data
            if buf.count(b"data: {") >= after:
                sock.setblocking(False)
                try:
                    while data := sock.recv(65536):
                        buf += data
                except BlockingIOError:
                    pass
                done = True
    for line in buf.decode(errors="replace").split("\n"):  # chunked framing lines are skipped
        if line.startswith("data: {") and line.endswith("}"):
            chunk = json.loads(line.removeprefix("data: "))
            log.kinds.append("chunk")
            log.times.append(time.monotonic())
            for choice in chunk.get("choices", []):
                log.text += choice.get("text") or ""
    return log


def start_streams(server: Server, bodies: list[dict], **kw) -> tuple[list[threading.Thread], list]:
    logs = [StreamLog() for _ in bodies]
    threads = [
        threading.Thread(target=stream_completion, args=(server, b, lg), kwargs=kw, daemon=True)
        for b, lg in zip(bodies, logs)
    ]
    for t in threads:
        t.start()
    return threads, logs


def join_all(threads: list[threading.Thread], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(timeout=max(0.1, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a client is still waiting"


# -- what was delivered and what was billed ---------------------------------------------------


def received_tokens(server: Server, log: StreamLog) -> tuple[int, int]:
    """The output tokens behind the text the client received, from the request's output stream
    read by the same rules as the relay: (fewest, most) when tokens that decode to nothing make
    it ambiguous."""
    raw = [decode_event(f) for _, f in server.redis.xrange(f"fleetlm:out:{log.request_id}")]
    _, events = follow(raw)
    text, position = "", 0
    matches = [0] if log.text == "" else []
    for event in events:
        text += event.get("text", "")
        if event["type"] == "delta":
            position = event["completion_tokens"]
        elif "usage" in event:
            position = event["usage"]["completion_tokens"]
        if text == log.text:
            matches.append(position)
    assert matches, f"{log.request_id}: the client's text is not a prefix of what was published"
    return min(matches), max(matches)


def check_billing(server: Server, logs: list[StreamLog], timeout_s: float = 60) -> dict:
    """Every admitted request has exactly one usage row, billing the output tokens its client
    received (give or take the one in flight). Returns the rows by request id."""
    admitted = [lg for lg in logs if lg.status == 200]
    ids = [lg.request_id for lg in admitted]
    rows = server.usage_rows(ids, timeout_s=timeout_s)
    assert len(rows) == len(set(ids)), "one usage row per admitted request"
    by_id = {r.request_id: r for r in rows}
    for lg in admitted:
        lo, hi = received_tokens(server, lg)
        billed = by_id[lg.request_id].completion_tokens
        assert lo <= billed <= hi + 1, (lg.request_id, billed, (lo, hi), by_id[lg.request_id])
    return by_id


# -- the processes ----------------------------------------------------------------------------


def redis_pid(server: Server) -> int:
    return int(server.redis.info("server")["process_id"])


def postgres_processes(server: Server) -> list[psutil.Process]:
    pid_file = Path(server.data_dir) / "postgres" / "postmaster.pid"
    postmaster = psutil.Process(int(pid_file.read_text().splitlines()[0]))
    return [postmaster, *postmaster.children(recursive=True)]


def signal_all(processes: list[psutil.Process], sig: int) -> None:
    for proc in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def worker_pid(server: Server, worker_id: str) -> int:
    return json.loads(server.redis.get(f"fleetlm:worker:{worker_id}:alive"))["pid"]


def paused(pids: list[int]):
    """Context: the processes SIGSTOPped inside, SIGCONTed after (whatever happens)."""
    return _Paused(pids)


class _Paused:
    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def __enter__(self) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def __exit__(self, *exc) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
