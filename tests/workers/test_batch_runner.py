# The batch runner's pump in process, with the in-process GPU worker serving the batch queue:
# the input validated into lines, lines admitted through the API's own admission (the tenant's
# batch-priority limits, the batch stream), results collected into the output and error files,
# usage rolled up, output streams removed; a cancelled batch stops; silent pumps are re-armed.
from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from metering.batches import create_batch, get_batch, now, request_cancel
from metering.db import transaction
from metering.files import create_file, get_file
from metering.tenants import create_tenant
from service import streams as p
from tests.workers.conftest import SETTINGS, usage_record
from workers.batch.runner import Runner

pytestmark = pytest.mark.timeout(120)


def line(custom_id: str, **body) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body}
    body.setdefault("max_tokens", 3)
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.fixture
def runner(services, sessions) -> Runner:
    return Runner(SETTINGS, sessions, services.redis_url)


def new_batch(sessions, lines: list[dict], content: bytes | None = None):
    """A batch over these lines (or this raw content), stored as is: no upload checks."""
    if content is None:
        content = "".join(json.dumps(x) + "\n" for x in lines).encode()
    with transaction(sessions) as s:
        tenant, _ = create_tenant(s, f"batch-{time.monotonic_ns()}")
        f = create_file(s, tenant.id, "batch", "in.jsonl", content)
        key_id = tenant.api_keys[0].id
        batch = create_batch(
            s,
            tenant_id=tenant.id,
            key_id=key_id,
            endpoint="/v1/chat/completions",
            input_file_id=f.id,
            completion_window="24h",
            metadata=None,
        )
        return tenant.id, batch.id, batch.pump_token


def pump_until_final(runner: Runner, batch_id: str, token: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while runner.pump(batch_id, token):
        assert time.monotonic() < deadline, "the batch did not finish"
        time.sleep(0.05)


def file_lines(sessions, tenant_id, file_id) -> dict[str, dict]:
    with transaction(sessions) as s:
        content = get_file(s, tenant_id, file_id, with_content=True).content
    return {x["custom_id"]: x for x in map(json.loads, content.decode().splitlines())}


def test_a_batch_runs_to_its_output_and_error_files(gpu_worker, runner, sessions, rds):
    lines = [line("a"), line("b", max_tokens=4), line("bad-model", model="nope")]
    lines.append({**line("bad-body"), "body": {"model": "tiny", "messages": []}})
    tenant_id, batch_id, token = new_batch(sessions, lines)
    pump_until_final(runner, batch_id, token)
    with transaction(sessions) as s:
        batch = get_batch(s, tenant_id, batch_id)
        assert batch.status == "completed" and batch.completed_at is not None
        assert (batch.total, batch.completed, batch.failed) == (4, 2, 2)
        output_id, error_id = batch.output_file_id, batch.error_file_id
        tokens = (batch.input_tokens, batch.output_tokens)

    out = file_lines(sessions, tenant_id, output_id)
    assert set(out) == {"a", "b"}
    for custom_id, completion_tokens in (("a", 3), ("b", 4)):
        response = out[custom_id]["response"]
        assert response["status_code"] == 200 and out[custom_id]["error"] is None
        body = response["body"]
        assert body["object"] == "chat.completion" and body["service_tier"] == "flex"
        assert body["id"] == response["request_id"] == out[custom_id]["id"]
        assert body["usage"]["completion_tokens"] == completion_tokens
        record = usage_record(rds, body["id"])  # metered like any request, in the batch priority
        assert (record.batch_id, record.priority) == (batch_id, "batch")
        assert record.counts["prompt_tokens"] == body["usage"]["prompt_tokens"]
        assert not rds.exists(p.output_key(body["id"]))  # removed once collected
    assert tokens == (
        sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in out.values()),
        7,
    )

    err = file_lines(sessions, tenant_id, error_id)
    assert set(err) == {"bad-model", "bad-body"}
    assert err["bad-model"]["response"]["status_code"] == 404
    assert err["bad-model"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert err["bad-body"]["response"]["status_code"] == 400
    assert "messages" in err["bad-body"]["response"]["body"]["error"]["message"]


def test_a_cancelled_batch_stops_and_finalizes(gpu_worker, runner, sessions):
    tenant_id, batch_id, token = new_batch(sessions, [line(f"l{i}") for i in range(6)])
    assert runner.pump(batch_id, token)  # validates and fans the lines out
    with transaction(sessions) as s:
        assert request_cancel(get_batch(s, tenant_id, batch_id, lock=True))
    pump_until_final(runner, batch_id, token)
    with transaction(sessions) as s:
        batch = get_batch(s, tenant_id, batch_id)
        assert batch.status == "cancelled" and batch.cancelled_at is not None
        assert batch.total == 6 and batch.completed + batch.failed <= 6


def test_a_stale_pump_is_rearmed_and_the_old_chain_stops(gpu_worker, runner, sessions):
    tenant_id, batch_id, token = new_batch(sessions, [line("only")])
    with transaction(sessions) as s:
        get_batch(s, tenant_id, batch_id).created_at = now() - timedelta(hours=1)
    armed = dict(runner.sweep())
    assert batch_id in armed and armed[batch_id] != token
    assert not runner.pump(batch_id, token)  # superseded
    pump_until_final(runner, batch_id, armed[batch_id])
    with transaction(sessions) as s:
        assert get_batch(s, tenant_id, batch_id).status == "completed"


@pytest.mark.parametrize(
    "bad",
    [
        line("c" * 600),  # over the custom_id column: the INSERT failed, the pump retried forever
        line("nul\x00id"),
        {**line("other-url"), "url": "/v1/completions"},
    ],
)
def test_input_that_fails_validation_fails_the_batch_once(runner, sessions, bad):
    tenant_id, batch_id, token = new_batch(sessions, [line("ok"), bad, line("ok")])
    assert runner.pump(batch_id, token) is False  # final after one pump: nothing to retry
    with transaction(sessions) as s:
        batch = get_batch(s, tenant_id, batch_id)
        assert batch.status == "failed" and batch.failed_at is not None and batch.total == 0
        assert [e["line"] for e in batch.errors] == [2, 3]
        assert all(e["code"] == "invalid_file" for e in batch.errors)
        error_file = batch.error_file_id
    errors = {}
    with transaction(sessions) as s:
        content = get_file(s, tenant_id, error_file, with_content=True).content
    for x in map(json.loads, content.decode().split("\n")[:-1]):
        errors[x["error"]["line"]] = x
    assert set(errors) == {2, 3} and errors[3]["custom_id"] == "ok"  # the duplicate
    assert all(x["response"] is None for x in errors.values())
    assert runner.pump(batch_id, token) is False
    assert batch_id not in {b for b, _ in runner.sweep()}  # a failed batch is never re-armed


def test_a_file_that_is_not_jsonl_fails_the_batch(runner, sessions):
    tenant_id, batch_id, token = new_batch(sessions, [line("a")], content=b"not json\n")
    assert runner.pump(batch_id, token) is False
    with transaction(sessions) as s:
        batch = get_batch(s, tenant_id, batch_id)
        assert batch.status == "failed" and "not valid JSON" in batch.errors[0]["message"]
