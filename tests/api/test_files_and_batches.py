# /v1/files and /v1/batches in process, through the official SDK: each request is one
# transaction (committed before the response, rolled back on an error), scoped to the tenant.
from __future__ import annotations

import io
import json

import openai
import pytest

from tests.api.conftest import sdk

pytestmark = pytest.mark.timeout(60)


def jsonl(*custom_ids: str) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    lines = [
        {"custom_id": c, "method": "POST", "url": "/v1/chat/completions", "body": body}
        for c in custom_ids
    ]
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def upload(client: openai.OpenAI, content: bytes):
    return client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")


def test_files_are_stored_listed_read_and_deleted_per_tenant(app_client, make_tenant):
    mine, theirs = sdk(app_client, make_tenant().key), sdk(app_client, make_tenant().key)
    content = jsonl("a", "b")
    f = upload(mine, content)
    assert f.bytes == len(content) and f.purpose == "batch" and f.filename == "in.jsonl"
    assert mine.files.retrieve(f.id).id == f.id
    assert mine.files.content(f.id).content == content
    assert [x.id for x in mine.files.list()] == [f.id]
    assert list(theirs.files.list()) == []
    with pytest.raises(openai.NotFoundError):
        theirs.files.retrieve(f.id)
    assert mine.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError) as exc:
        mine.files.retrieve(f.id)
    assert exc.value.body["code"] == "file_not_found"


def test_a_malformed_file_is_refused(app_client, tenant):
    client = sdk(app_client, tenant.key)
    with pytest.raises(openai.BadRequestError) as exc:
        upload(client, b'{"custom_id": "a"}\n')
    assert exc.value.body["code"] == "invalid_batch_file" and exc.value.body["param"] == "file"
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("in.jsonl", io.BytesIO(jsonl("a"))), purpose="assistants")
    assert exc.value.body["param"] == "purpose"
    assert list(client.files.list()) == []


def test_a_batch_is_created_listed_and_cancelled(app_client, make_tenant):
    client, other = sdk(app_client, make_tenant().key), sdk(app_client, make_tenant().key)
    f = upload(client, jsonl("a", "b", "c"))
    batch = client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "finance"},
    )
    assert batch.status == "validating" and batch.metadata == {"team": "finance"}
    # committed before the response: the next request, another transaction, finds it
    assert client.batches.retrieve(batch.id).input_file_id == f.id
    assert [b.id for b in client.batches.list()] == [batch.id]
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    assert client.batches.cancel(batch.id).status == "cancelling"
    assert client.batches.cancel(batch.id).status == "cancelling"  # idempotent
    with pytest.raises(openai.NotFoundError) as exc:
        client.batches.cancel("batch_nope")
    assert exc.value.body["code"] == "batch_not_found"


def test_a_refused_batch_writes_nothing(app_client, tenant):
    client = sdk(app_client, tenant.key)
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert exc.value.body["code"] == "file_not_found"
    f = upload(client, jsonl("a"))
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h"
        )
    assert exc.value.body["param"] == "completion_window"
    assert list(client.batches.list()) == []
