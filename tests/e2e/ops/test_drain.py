# Graceful drain: SIGTERM to a worker mid-load loses no request (the running ones finish there,
# the unstarted ones are handed back and run on the other worker, each metered once); an API
# under drain answers 503 on /ready and on new requests while its open stream finishes.
from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest

from service import streams as p
from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.timeout(150)

N = 8
MAX_TOKENS = 96  # long enough that a held request is still unstarted when SIGTERM lands


def stream_chat(base_url: str, key: str, results: dict, i: int) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Story number {i}, please."}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    out: dict = {"chunks": 0, "finish": None, "error": None}
    try:
        with httpx.stream(
            "POST", base_url + "/v1/chat/completions", json=body, headers=headers, timeout=90
        ) as r:
            out["status"] = r.status_code
            out["request_id"] = r.headers.get("x-request-id")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out["error"] = chunk["error"]
                    continue
                out["chunks"] += 1
                for choice in chunk.get("choices", []):
                    out["finish"] = choice.get("finish_reason") or out["finish"]
    except Exception as exc:  # asserted on below
        out["error"] = repr(exc)
    results[i] = out


def test_sigterm_worker_mid_load_loses_no_request(fleet):
    results: dict[int, dict] = {}
    threads = [
        threading.Thread(target=stream_chat, args=(fleet.base_url, fleet.key, results, i))
        for i in range(N)
    ]
    for t in threads:
        t.start()

    def busy_worker():
        # Two held beyond the running ones: the stats are a step old by the time SIGTERM lands,
        # and one request may start meanwhile.
        for w in fleet.workers_stats():
            if w["num_running"] > 0 and w["num_inflight"] >= w["num_running"] + 2:
                return w["id"]
        return None

    victim = wait_until(busy_worker, 30, "a worker running some requests and holding two more")
    pid = json.loads(fleet.redis.get(f"fleetlm:worker:{victim}:alive"))["pid"]
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: fleet.redis.get(f"fleetlm:worker:{victim}:alive") is None, 60,
               "the drained worker to leave")  # fmt: skip
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a stream hung"

    assert len(results) == N
    for i, r in results.items():
        assert r["status"] == 200 and r["error"] is None, (i, r)
        assert r["finish"] == "length", (i, r)
    rows = fleet.usage_rows([r["request_id"] for r in results.values()])
    assert len(rows) == N, "each request metered exactly once"
    assert {row.status for row in rows} == {"length"}
    assert {row.completion_tokens for row in rows} == {MAX_TOKENS}
    by_worker = {row.worker_id for row in rows}
    assert victim in by_worker, "the drained worker finished what it had started"
    assert len(by_worker) == 2
    log = fleet.log_path.read_text(errors="replace")
    handed_back = [
        json.loads(line)
        for line in log.splitlines()
        if line.startswith("{") and '"draining: handed back' in line
    ]
    assert handed_back and not handed_back[-1]["msg"].startswith("draining: handed back 0")


def queued_interactive(fleet) -> int:
    """Interactive entries on every queue: the shared one and the workers' own (routing)."""
    routes = fleet.redis.smembers(p.ROUTES_SET)
    return sum(fleet.redis.xlen(q) for q in p.queue_keys("interactive", sorted(routes)))


def test_api_drain_refuses_new_work_and_finishes_open_streams(fleet):
    # A separate `fleetlm api` on the same services, so the fleet fixture's API stays up.
    import subprocess

    from tests.e2e.conftest import CLI, ROOT, free_port

    port = free_port()
    env = {**fleet.env, "FLEETLM_PORT": str(port), "FLEETLM_DRAIN_DELAY_S": "1"}
    env["FLEETLM_METRICS_PORT"] = "0"  # the fleet's API holds the metrics port
    log = open(fleet.log_path, "a")  # noqa: SIM115 - the child keeps writing to it
    api = subprocess.Popen(
        [*CLI, "api", "--data-dir", str(fleet.data_dir)],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready():
            try:
                return httpx.get(base + "/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(ready, 60, "the second API")
        except AssertionError:
            raise AssertionError(fleet.log()) from None
        results: dict[int, dict] = {}
        t = threading.Thread(target=stream_chat, args=(base, fleet.key, results, 0))
        t.start()
        try:
            wait_until(lambda: queued_interactive(fleet) > 0, 20, "the stream")
        except AssertionError:
            raise AssertionError(f"{results}\n{fleet.log()}") from None
        api.send_signal(signal.SIGTERM)
        r = wait_until(
            lambda: (g := httpx.get(base + "/ready", timeout=2)).status_code == 503 and g,
            10,
            "/ready to turn 503",
        )
        assert r.json()["status"] == "draining"
        refused = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {fleet.key}"},
            timeout=10,
        )
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_draining"
        t.join(timeout=60)
        assert results[0]["error"] is None and results[0]["finish"] == "length", results[0]
        api.wait(timeout=30)
    finally:
        if api.poll() is None:
            api.kill()
            api.wait()
