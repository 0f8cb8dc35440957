# The Files and Batches API with the official openai SDK: the happy path, bad lines, file
# validation, tenant isolation and cancellation.
from __future__ import annotations

import io

import openai
import pytest

from tests.e2e.batches.conftest import chat_line, jsonl, read_lines, submit, wait_batch


def test_batch_completes_with_every_custom_id_once(server):
    client = server.openai()
    lines = [chat_line(f"req-{i}", f"hello {i}") for i in range(12)]
    batch = submit(client, lines)
    assert batch.status == "validating"
    done = wait_batch(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 12
    assert done.request_counts.completed == 12 and done.request_counts.failed == 0
    for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
        assert getattr(done, stamp) is not None
    assert done.error_file_id is None
    out = read_lines(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    for x in out:
        assert x["error"] is None and x["response"]["status_code"] == 200
        body = x["response"]["body"]
        assert body["object"] == "chat.completion"
        assert isinstance(body["choices"][0]["message"]["content"], str)
        assert body["usage"]["completion_tokens"] >= 1
    assert done.usage.output_tokens == sum(
        x["response"]["body"]["usage"]["completion_tokens"] for x in out
    )
    assert done.usage.input_tokens > 0
    rows = server.usage_rows([x["id"] for x in out])
    assert {r.batch_id for r in rows} == {batch.id}
    assert {r.priority for r in rows} == {"batch"}
    assert len(rows) == 12


def test_bad_lines_go_to_the_error_file(server):
    client = server.openai()
    lines = [
        chat_line("good-1"),
        chat_line("bad-model", model="nope"),
        chat_line("good-2"),
        {**chat_line("bad-body"), "body": {"model": "tiny", "messages": []}},
    ]
    done = wait_batch(client, submit(client, lines).id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
    out = {x["custom_id"]: x for x in read_lines(client, done.output_file_id)}
    err = {x["custom_id"]: x for x in read_lines(client, done.error_file_id)}
    assert set(out) == {"good-1", "good-2"} and set(err) == {"bad-model", "bad-body"}
    assert err["bad-model"]["response"]["status_code"] == 404
    assert "nope" in err["bad-model"]["response"]["body"]["error"]["message"]
    assert err["bad-body"]["response"]["status_code"] == 400
    assert "messages" in err["bad-body"]["response"]["body"]["error"]["message"]


def test_malformed_files_are_refused_on_upload(server):
    client = server.openai()
    dup = jsonl([chat_line("same"), chat_line("same")])
    for content, needle in (
        (b"not json\n", "not valid JSON"),
        (dup, "duplicate custom_id"),
        (jsonl([{**chat_line("x"), "url": "/v1/embeddings"}]), "url must be one of"),
        (jsonl([{**chat_line("x"), "method": "GET"}]), "method must be POST"),
    ):
        with pytest.raises(openai.BadRequestError, match=needle):
            client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")


def test_files_and_batches_are_tenant_scoped(server):
    mine = server.openai()
    other = openai.OpenAI(
        base_url=server.base_url + "/v1",
        api_key=server.create_tenant("batch-other"),
        max_retries=0,
        timeout=60,
    )
    f = mine.files.create(file=("a.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch")
    assert mine.files.retrieve(f.id).bytes > 0
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(f.id)
    assert f.id not in [x.id for x in other.files.list()]
    with pytest.raises(openai.BadRequestError):
        other.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    batch = mine.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    assert batch.id in [b.id for b in mine.batches.list(limit=100)]
    assert wait_batch(mine, batch.id).status == "completed"
    assert mine.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        mine.files.retrieve(f.id)


def test_cancel_mid_way_keeps_finished_results(server):
    client = server.openai()
    lines = [chat_line(f"c-{i}", max_tokens=24, ignore_eos=True) for i in range(60)]
    batch = submit(client, lines)
    wait_batch(client, batch.id, until=lambda b: b.request_counts.completed >= 3)
    client.batches.cancel(batch.id)
    done = wait_batch(client, batch.id)
    assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
    out = read_lines(client, done.output_file_id)
    err = read_lines(client, done.error_file_id)
    assert 3 <= len(out) < 60
    assert len(out) == done.request_counts.completed
    ids = [x["custom_id"] for x in out + err]
    assert len(ids) == len(set(ids))
    assert all(x["response"]["status_code"] == 200 for x in out)
