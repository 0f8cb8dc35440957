# Tenant limits at admission, in process: concurrency and tokens-per-minute 429s with
# x-ratelimit-* headers and Retry-After, a request larger than the limit, priorities kept apart,
# and a revoked key refused once the key cache expires. Refunds are the worker's (tests/workers).
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from metering.db import transaction
from metering.tenants import revoke_key
from service.limit_reservations import window_key
from tests.api.conftest import SETTINGS
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

PROMPT = list(range(1, 11))  # 10 prompt tokens, exactly


def post(app_client, key: str, **body):
    return app_client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, **body},
        headers={"Authorization": f"Bearer {key}"},
    )


def seconds(duration: str) -> float:
    """OpenAI's x-ratelimit-reset-* format: "0s", "250ms", "7.5s", "1m30s"."""
    m = re.fullmatch(r"(?:(\d+)m)?(?:([\d.]+)s)?|(\d+)ms", duration)
    assert m is not None and duration, duration
    if m.group(3):
        return int(m.group(3)) / 1000
    return int(m.group(1) or 0) * 60 + float(m.group(2) or 0)


def away_from_minute_edge() -> None:
    """Token windows are UTC minutes: keep a test's reservations inside one window."""
    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)


def test_concurrency_limit_is_a_429_with_headers(app_client, make_tenant, worker):
    tenant = make_tenant(interactive=(1, None))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, app_client, tenant.key, max_tokens=3)
        queued = worker.take(tenant)
        refused = post(app_client, tenant.key, max_tokens=3)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "requests"
        assert refused.headers["x-ratelimit-limit-requests"] == "1"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.headers["x-ratelimit-reset-requests"] == "1s"
        assert int(refused.headers["retry-after"]) >= 1
        worker.publish(queued.request_id, worker.done("ok", 10, 3))
        admitted = first.result(timeout=30)
    assert admitted.status_code == 200
    assert admitted.headers["x-ratelimit-limit-requests"] == "1"
    assert admitted.headers["x-ratelimit-remaining-requests"] == "0"


def test_tokens_per_minute_reserve_and_refuse(app_client, make_tenant, worker, rds):
    away_from_minute_edge()
    tenant = make_tenant(interactive=(None, 600))
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(post, app_client, tenant.key, max_tokens=500)
        queued = worker.take(tenant)
        reserved = queued.reservation
        assert reserved is not None and reserved.tokens == 510  # prompt + max_tokens
        key = window_key(str(tenant.id), "interactive", reserved.window)
        assert int(rds.get(key)) == 510
        # 10 + 100 > 90 left: refused before any byte, with the headers
        refused = post(app_client, tenant.key, max_tokens=100)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "tokens"
        assert refused.headers["x-ratelimit-limit-tokens"] == "600"
        assert refused.headers["x-ratelimit-remaining-tokens"] == "90"
        # It fits once this minute's 510 tokens have slid out far enough: the rest of this minute,
        # then 60 × (1 − 490/510) ≈ 2.4 s of the next one (service/limit_reservations.py).
        assert 1 <= int(refused.headers["retry-after"]) <= 63
        # Until the window counts nothing: the rest of this minute, then all of the next.
        assert 60 <= seconds(refused.headers["x-ratelimit-reset-tokens"]) <= 120
        worker.publish(queued.request_id, worker.done("ok", 10, 500))
        admitted = big.result(timeout=30).headers
        assert admitted["x-ratelimit-remaining-tokens"] == "90"
        assert 60 <= seconds(admitted["x-ratelimit-reset-tokens"]) <= 120
    too_big = post(app_client, tenant.key, max_tokens=700)
    assert too_big.status_code == 429 and "too large" in too_big.json()["error"]["message"]


def test_batch_and_interactive_budgets_are_apart(app_client, make_tenant, worker):
    away_from_minute_edge()
    tenant = make_tenant(batch=(None, 30), interactive=(None, 1000))
    refused = post(app_client, tenant.key, max_tokens=25, service_tier="flex")
    assert refused.status_code == 429
    assert refused.headers["x-ratelimit-limit-tokens"] == "30"
    with ThreadPoolExecutor(1) as pool:
        interactive = pool.submit(post, app_client, tenant.key, max_tokens=25)
        queued = worker.take(tenant)
        worker.publish(queued.request_id, worker.done("ok", 10, 25))
        ok = interactive.result(timeout=30)
    assert ok.status_code == 200 and ok.headers["x-ratelimit-limit-tokens"] == "1000"


def test_a_revoked_key_is_refused_once_the_key_cache_expires(app_client, tenant, sessions):
    headers = {"Authorization": f"Bearer {tenant.key}"}
    assert app_client.get("/v1/models", headers=headers).status_code == 200
    with transaction(sessions) as s:
        assert len(revoke_key(s, tenant.key[:10])) == 1

    def refused():
        r = app_client.get("/v1/models", headers=headers)
        return r if r.status_code == 401 else None

    r = wait_until(refused, SETTINGS.api_key_cache_s + 10, "the revoked key to be refused")
    assert r.json()["error"]["code"] == "invalid_api_key"
