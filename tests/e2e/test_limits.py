# Tenant limits at admission: concurrency and tokens-per-minute 429s with x-ratelimit-* headers,
# refunds of unused tokens when a request ends, no overshoot under a concurrent burst, batch and
# interactive budgets kept apart, revoked keys refused.
from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serving.conftest import wait_until

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
    value = server.redis.get(f"fleetlm:limit:{tenant_id}:{priority}:tpm:{window}")
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
        assert 1 <= int(refused.headers["retry-after"]) <= 60
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


def test_request_larger_than_the_limit_and_revoked_key(server):
    name = unique("small")
    key = server.create_tenant(name, "--tpm", "20")
    too_big = post(server, key, "/v1/completions", {"prompt": PROMPT, "max_tokens": 50})
    assert too_big.status_code == 429 and "too large" in too_big.json()["error"]["message"]
    prefix = key[:10]
    server.cli("tenants", "revoke-key", prefix)
    time.sleep(1.2)  # FLEETLM_API_KEY_CACHE_S=1 in the tests
    gone = post(server, key, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
    assert gone.status_code == 401
    assert gone.json()["error"]["code"] == "invalid_api_key"


def test_token_window_slides_over_the_minute_boundary(server):
    # Script-level: the previous minute's tokens still count, weighted by the share of that
    # minute inside the last 60 s. Fixed windows would admit here (this minute is empty).
    from metering import ratelimit as rl

    if time.time() % 60 > 45:  # the previous minute's weight must stay large for the check
        time.sleep(61 - time.time() % 60)
    r = server.redis
    prefix = f"fleetlm:limit:test-{uuid.uuid4().hex[:6]}:interactive:tpm"
    running = prefix.replace(":tpm", ":running")
    minute = int(time.time() // 60)
    r.set(f"{prefix}:{minute - 1}", 10_000)  # ten times the limit, all in the previous minute

    def reserve(tokens: int, request_id: str) -> rl.Decision:
        args = rl.reserve_args(rl.PriorityLimit(tokens_per_minute=1000), request_id, tokens, 60)
        return rl.decision(r.eval(rl.RESERVE_SCRIPT, 2, running, prefix, *args))

    elapsed = time.time() % 60
    d = reserve(1, "a")
    assert not d.admitted and d.exceeded == "tokens"
    # Weighted previous minute: 10,000 × (1 - elapsed / 60), at least 2,500 here.
    assert abs(d.tokens_used - 10_000 * (1 - elapsed / 60)) < 10_000 * 2 / 60
    # It fits once that share decays below 999 tokens: (used - 999) / (10,000 / 60) seconds.
    expected_ms = (d.tokens_used - 999) / (10_000 / 60) * 1000
    assert abs(d.reset_ms - expected_ms) < 2500
    # An empty previous minute: the current one alone counts, as before.
    r.delete(f"{prefix}:{minute - 1}")
    assert reserve(400, "b").admitted and reserve(600, "c").admitted
    d = reserve(1, "d")
    assert not d.admitted and d.tokens_used == 1000
