# Metering end to end: `fleetlm serve`'s writer turns every request's usage record into exactly one
# Postgres row (completed, cancelled and failed alike); /v1/usage and `fleetlm usage` report them
# per tenant, isolated, with totals equal to the raw rows.
from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from engine.sampling_params import SamplingParams
from metering.records import METERING_STREAM, encode_record
from service import streams as p
from service.queued_request import QueuedRequest

pytestmark = pytest.mark.timeout(120)

PROMPT = list(range(1, 11))


def get(server, key: str, path: str, **params) -> httpx.Response:
    return httpx.get(
        server.base_url + path,
        params=params,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def complete(server, key: str, max_tokens: int = 3) -> str:
    r = httpx.post(
        server.base_url + "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_one_row_per_request_completed_cancelled_failed(server):
    done = complete(server, server.key)
    stream = server.openai().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], max_tokens=2000, stream=True
    )
    cancelled = next(iter(stream)).id
    stream.close()
    # a request the worker rejects (a sampling parameter out of range) ends as failed
    (tenant_id,) = server.query("SELECT id FROM tenants WHERE name = 'demo'")[0]
    failed = f"cmpl-{uuid.uuid4().hex}"
    bad = QueuedRequest(
        request_id=failed,
        tenant_id=str(tenant_id),
        key_id=str(uuid.uuid4()),
        model="tiny",
        endpoint="completions",
        priority="interactive",
        prompt_token_ids=PROMPT,
        sampling=SamplingParams(),
        enqueued_at=time.time(),
    )
    message = json.loads(bad.encode())
    message["sampling"]["temperature"] = -1.0  # as no admission writes it
    server.redis.xadd(p.queue_key("interactive"), {"r": json.dumps(message)})
    rows = server.usage_rows([done, cancelled, failed])
    assert sorted(r.request_id for r in rows) == sorted([done, cancelled, failed])
    status = {r.request_id: r.status for r in rows}
    assert status == {done: "length", cancelled: "cancelled", failed: "failed"}  # max_tokens=3
    # a redelivered record (re-XADDed) does not make a second row
    record = server.usage_record(done)
    server.redis.xadd(METERING_STREAM, encode_record(record))
    complete(server, server.key)  # something after it, so we know the writer went past it
    time.sleep(1.0)
    assert len(server.query("SELECT 1 FROM usage_records WHERE request_id = :r", r=done)) == 1


def test_usage_is_per_tenant_and_matches_raw_rows(server):
    a, b = f"fin-a-{uuid.uuid4().hex[:6]}", f"fin-b-{uuid.uuid4().hex[:6]}"
    key_a, key_b = server.create_tenant(a), server.create_tenant(b)
    ids_a = [complete(server, key_a) for _ in range(2)]
    ids_b = [complete(server, key_b)]
    server.usage_rows(ids_a + ids_b)

    mine = get(server, key_a, "/v1/usage", group_by="model")
    assert mine.status_code == 200, mine.text
    body = mine.json()
    assert body["tenant"] == a and body["total_requests"] == 2
    (line,) = body["data"]
    raw = server.query(
        "SELECT count(*), sum(prompt_tokens), sum(completion_tokens), sum(cost_micros)"
        " FROM usage_records u JOIN tenants t ON t.id = u.tenant_id WHERE t.name = :n",
        n=a,
    )[0]
    assert (line["requests"], line["prompt_tokens"], line["completion_tokens"]) == tuple(raw[:3])
    assert line["cost_micros"] == raw[3]

    # isolation: a tenant key cannot read another tenant, nor use admin endpoints
    assert get(server, key_a, "/v1/usage", tenant=b).status_code == 403
    assert get(server, key_a, "/v1/admin/tenants").status_code == 403
    assert get(server, key_a, "/internal/workers").status_code == 403  # fleet-wide figures
    assert get(server, server.admin_key, "/internal/workers").status_code == 200
    theirs = get(server, server.admin_key, "/v1/usage", tenant=b)
    assert theirs.status_code == 200 and theirs.json()["total_requests"] == 1
    tenants = get(server, server.admin_key, "/v1/admin/tenants").json()["data"]
    assert {a, b} <= {t["tenant"] for t in tenants}

    csv = get(server, key_a, "/v1/usage", format="csv", group_by="priority")
    assert csv.headers["content-type"].startswith("text/csv")
    header, row = csv.text.strip().splitlines()
    assert header.startswith("priority,requests,") and row.startswith("interactive,2,")

    report = json.loads(server.cli("usage", "--tenant", a, "--json", "--group-by", "model"))
    assert [(x["model"], x["requests"]) for x in report["lines"]] == [("tiny", 2)]
    assert {"prompt_tokens", "cached_tokens", "completion_tokens", "cost"} <= set(
        report["lines"][0]
    )
