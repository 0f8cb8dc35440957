# Tenant limits end to end: no overshoot under a concurrent burst, the unused part of a
# reservation refunded once when a request ends, batch and interactive budgets kept apart.
# (Headers, too-large requests and revoked keys: tests/api/test_limits.py; the token window's
# script: tests/service/test_limit_reservations.py.)
from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from service.limit_reservations import window_key
from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.timeout(120)

PROMPT = list(range(1, 11))  # 10 prompt tokens, exactly


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def post(server, key: str, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(
        server.base_url + path,
        json={"model": "tiny", **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
        **kw,
    )


def away_from_minute_edge() -> None:
    """Token windows are UTC minutes: keep a test's reservations inside one window."""
    if time.time() % 60 > 40:
        time.sleep(61 - time.time() % 60)


def tokens_used(server, tenant: str, priority: str = "interactive") -> int:
    (tenant_id,) = server.query("SELECT id FROM tenants WHERE name = :n", n=tenant)[0]
    window = int(time.time() // 60)
    value = server.redis.get(window_key(tenant_id, priority, window))
    return int(value or 0)


def test_burst_of_20_against_a_concurrency_limit_of_5(server):
    name = unique("burst")
    key = server.create_tenant(name, "--max-concurrency", "5")
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 2000,
        "stream": True,
    }
    start, release = threading.Barrier(20), threading.Event()
    statuses: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def one() -> None:
        start.wait()
        with (
            httpx.Client(timeout=60) as client,
            client.stream(
                "POST",
                server.base_url + "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as r,
        ):
            with lock:
                statuses.append((r.status_code, dict(r.headers)))
            if r.status_code == 200:
                release.wait(60)  # hold the slot until everyone has an answer

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(one) for _ in range(20)]
        wait_until(lambda: len(statuses) == 20, 60, "20 answers")
        release.set()
        for f in futures:
            f.result()
    codes = sorted(code for code, _ in statuses)
    assert codes == [200] * 5 + [429] * 15
    for code, headers in statuses:
        assert headers["x-ratelimit-limit-requests"] == "5"
        if code == 429:
            assert int(headers["retry-after"]) >= 1
            assert headers["x-ratelimit-remaining-requests"] == "0"
    # the streams were closed: their slots come back and the tenant is admitted again
    short = {**body, "stream": False, "max_tokens": 2}
    wait_until(
        lambda: post(server, key, "/v1/chat/completions", short).status_code == 200,
        30,
        "a slot to free up",
        0.3,
    )


def test_tokens_per_minute_reserve_then_refund(server):
    away_from_minute_edge()
    name = unique("tpm")
    key = server.create_tenant(name, "--tpm", "600")
    headers = {"Authorization": f"Bearer {key}"}
    big = {"model": "tiny", "prompt": PROMPT, "max_tokens": 500, "stream": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", server.base_url + "/v1/completions", json=big, headers=headers) as r,
    ):
        assert r.status_code == 200
        assert r.headers["x-ratelimit-limit-tokens"] == "600"
        assert r.headers["x-ratelimit-remaining-tokens"] == "90"  # 600 - (10 + 500)
        big_id = r.headers["x-request-id"]
        # 10 + 100 > 90 left: refused before any byte, with the headers
        refused = post(server, key, "/v1/completions", {"prompt": PROMPT, "max_tokens": 100})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "tokens"
        assert refused.headers["x-ratelimit-remaining-tokens"] == "90"
        # It fits once this minute's 510 tokens have slid out far enough: the rest of this minute,
        # then 60 × (1 − 490/510) ≈ 2.4 s of the next one (service/limit_reservations.py).
        assert 1 <= int(refused.headers["retry-after"]) <= 63
        assert refused.headers["x-ratelimit-reset-tokens"].endswith("s")
        for line in r.iter_lines():  # a few tokens, then hang up: cancelled
            if line.startswith("data: {"):
                break
    record = server.usage_record(big_id)
    assert record.status == "cancelled"
    used_big = 10 + record.counts["completion_tokens"]
    # the unused part of the reservation came back exactly once
    wait_until(lambda: tokens_used(server, name) == used_big, 10, "the refund")
    ok = post(server, key, "/v1/completions", {"prompt": PROMPT, "max_tokens": 100})
    assert ok.status_code == 200, ok.text
    used_ok = ok.json()["usage"]["total_tokens"]
    wait_until(lambda: tokens_used(server, name) == used_big + used_ok, 10, "the second refund")


def test_interactive_is_admitted_while_batch_budget_is_exhausted(server):
    away_from_minute_edge()
    name = unique("classes")
    key = server.create_tenant(name, "--batch-tpm", "50", "--tpm", "1000")
    batch = {"prompt": PROMPT, "max_tokens": 40, "service_tier": "flex"}
    first = post(server, key, "/v1/completions", batch)
    assert first.status_code == 200, first.text
    second = post(server, key, "/v1/completions", {**batch, "max_tokens": 39})
    used = first.json()["usage"]["total_tokens"]
    if used + 10 + 39 > 50:
        assert second.status_code == 429
        assert second.headers["x-ratelimit-limit-tokens"] == "50"
    interactive = post(server, key, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5})
    assert interactive.status_code == 200
    assert interactive.headers["x-ratelimit-limit-tokens"] == "1000"
    assert tokens_used(server, name, "interactive") == interactive.json()["usage"]["total_tokens"]
