# `fleetlm serve` with two API processes on one port (fleetlm/api_processes.py): each serves
# streams on its own (the other one stopped with SIGSTOP, so the kernel can only hand new
# connections to it), /metrics from either reports the sum over both, one killed with SIGKILL is
# restarted while the other keeps the port answering (its counts stay in the sum), and on SIGTERM
# both finish the streams they relay before `serve` exits. One `fleetlm serve` for both tests: the
# drain test, last, ends it.
from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import start_server
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

PER_PHASE = 3
DRAIN_TOKENS = 1200  # seconds of streaming on CPU: still running when SIGTERM lands
ENV = {"FLEETLM_API_PROCESSES": "2", "FLEETLM_DRAIN_DELAY_S": "0.5"}


@pytest.fixture(scope="module")
def two_apis(tmp_path_factory):
    """A serve with two API processes, started on first use and again after one has ended."""
    started = []

    def get():
        if not started or started[-1].proc.poll() is not None:
            data_dir = tmp_path_factory.mktemp("two-apis") / "data"
            started.append(start_server(data_dir, workers=None, env=ENV))
        return started[-1]

    yield get
    for server in started:
        server.stop()


def api_pids(serve_pid: int) -> list[int]:
    """The `fleetlm api` children of this `fleetlm serve`, by their inherited-socket flag."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if ppid == serve_pid and b"api" in argv and b"--listen-fds" in argv:
            pids.append(int(entry.name))
    return sorted(pids)


def stream_one(server, client: httpx.Client, prompt: str) -> int:
    """One streamed completion; returns its completion tokens from the trailing usage chunk."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {server.key}"}
    usage = None
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None
    return usage["completion_tokens"]


def admissions(server) -> float:
    r = httpx.get(
        server.base_url + "/metrics",
        headers={"Authorization": f"Bearer {server.admin_key}"},
        timeout=10,
    )
    r.raise_for_status()
    found = re.findall(r'^fleetlm:admissions_total\{[^}]*tenant="demo"[^}]*\} (\S+)$', r.text, re.M)
    return sum(float(v) for v in found)


def phase(server, label: str) -> None:
    # A fresh client per phase: new connections, accepted by whichever process may accept.
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for i in range(PER_PHASE):
            assert stream_one(server, client, f"{label} {i}") == 8


def test_two_api_processes_share_the_port(two_apis):
    server = two_apis()
    before = admissions(server)
    pids = wait_until(
        lambda: (p := api_pids(server.proc.pid)) and len(p) == 2 and p, 30, "two API pids"
    )
    assert "2 API process(es)" in server.log()
    # Each process alone: the other is stopped, so only one can accept the connections.
    for stopped in pids:
        os.kill(stopped, signal.SIGSTOP)
        try:
            phase(server, f"without {stopped}")
        finally:
            os.kill(stopped, signal.SIGCONT)
    # Either process's /metrics sums both: every admission so far.
    wait_until(lambda: admissions(server) == before + 2 * PER_PHASE, 20, "summed admissions")

    victim, survivor = pids
    os.kill(victim, signal.SIGKILL)
    phase(server, "after the kill")  # the port answers meanwhile
    restarted = wait_until(
        lambda: (p := api_pids(server.proc.pid)) and len(p) == 2 and victim not in p and p,
        60,
        "the killed API process to be restarted",
    )
    assert survivor in restarted
    assert re.search(r"api-\d exited \(-9\); restarting", server.log())
    # The dead process's counts stay in the sum.
    wait_until(lambda: admissions(server) == before + 3 * PER_PHASE, 20, "admissions after a kill")


def test_both_processes_drain_their_streams_on_sigterm(two_apis):
    server = two_apis()
    results: dict[int, int | BaseException] = {}
    opened: dict[int, threading.Event] = {}

    def stream(pid: int) -> None:
        body = {
            "model": "tiny",
            "prompt": f"drain {pid}",
            "max_tokens": DRAIN_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        headers = {"Authorization": f"Bearer {server.key}"}
        usage = None
        try:
            with (
                httpx.Client(base_url=server.base_url, timeout=120) as client,
                client.stream("POST", "/v1/completions", json=body, headers=headers) as r,
            ):
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        opened[pid].set()
                        usage = json.loads(line[6:]).get("usage") or usage
            results[pid] = usage["completion_tokens"] if usage else 0
        except BaseException as exc:  # reported by the main thread
            results[pid] = exc
            opened[pid].set()

    try:
        pids = wait_until(
            lambda: (p := api_pids(server.proc.pid)) and len(p) == 2 and p, 30, "two API pids"
        )
        threads = []
        # One stream per process: the other is stopped while the stream's connection is taken.
        for stopped, serving in (pids, pids[::-1]):
            opened[serving] = threading.Event()
            os.kill(stopped, signal.SIGSTOP)
            try:
                thread = threading.Thread(target=stream, args=(serving,), daemon=True)
                thread.start()
                threads.append(thread)
                assert opened[serving].wait(60), "the stream did not start"
            finally:
                os.kill(stopped, signal.SIGCONT)
        assert not results, results  # both still streaming
        server.proc.send_signal(signal.SIGTERM)  # both API processes drain while streaming
        for thread in threads:
            thread.join(timeout=120)
        assert results == {pid: DRAIN_TOKENS for pid in pids}, results
        assert server.proc.wait(timeout=60) == 0, server.log()
    finally:
        server.stop()
