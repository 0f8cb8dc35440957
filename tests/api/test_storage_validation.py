# Validation at the edge matching storage: strings that would fail Postgres (NUL, over a column's
# length) are 400s naming the field, ids that cannot exist are 404s without a query, batch files
# are checked line by line like the columns; /metrics needs an admin key; and the OpenAPI
# document describes what the server really answers.
from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager

import openai
import pytest
from sqlalchemy import event

from tests.api.conftest import sdk

pytestmark = pytest.mark.timeout(60)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def queries(app_client) -> Iterator[list[str]]:
    """The SQL statements the app runs meanwhile."""
    engine, seen = app_client.app.state.fleetlm.db, []

    def record(conn, cursor, statement, *args):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def jsonl(*lines: dict) -> bytes:
    return "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()


def line(custom_id: str, **body) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def upload(client: openai.OpenAI, content: bytes):
    return client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/files/file-%00"),
        ("GET", "/v1/files/not-an-id"),
        ("GET", "/v1/files/a%00b/content"),
        ("DELETE", "/v1/files/" + "f" * 5000),
        ("GET", "/v1/batches/batch_%00"),
        ("POST", "/v1/batches/x%00y/cancel"),
    ],
)
def test_ids_that_cannot_exist_are_404_without_a_query(app_client, tenant, method, path):
    app_client.get("/v1/models", headers=auth(tenant.key))  # the key, verified and cached
    with queries(app_client) as seen:
        response = app_client.request(method, path, headers=auth(tenant.key))
    assert response.status_code == 404
    assert response.json()["error"]["code"] in ("file_not_found", "batch_not_found")
    assert not [s for s in seen if "files" in s or "batches" in s], seen


def test_list_filters_with_nul_are_not_500s(app_client, tenant):
    headers = auth(tenant.key)
    listed = app_client.get("/v1/files", params={"after": "a\x00b"}, headers=headers)
    assert listed.status_code == 200 and listed.json()["data"] == []
    assert (
        app_client.get("/v1/batches", params={"after": "\x00"}, headers=headers).status_code == 200
    )
    refused = app_client.get("/v1/files", params={"purpose": "batch\x00"}, headers=headers)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "purpose"
    assert "NUL" in refused.json()["error"]["message"]


def test_a_batch_needs_a_well_formed_input_file_id(app_client, tenant):
    client = sdk(app_client, tenant.key)
    for file_id in ("file-\x00", "x" * 65, ""):
        with pytest.raises(openai.BadRequestError) as exc:
            client.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert exc.value.body["param"] == "input_file_id" and exc.value.body["code"]


def test_batch_metadata_follows_openai_limits(app_client, tenant):
    client = sdk(app_client, tenant.key)
    f = upload(client, jsonl(line("a")))
    for metadata in ({"k": "v" * 100_000}, {f"k{i}": "v" for i in range(17)}, {"k": "\x00"}):
        with pytest.raises(openai.BadRequestError) as exc:
            client.batches.create(
                input_file_id=f.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata=metadata,
            )
        assert exc.value.body["param"] == "metadata"
    assert list(client.batches.list()) == []


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (jsonl(line("c" * 501)), "custom_id must be at most 500"),
        (jsonl(line("a\x00b")), "custom_id must not contain NUL"),
        (b'{"custom_id": "a\\ud800", "method": "POST"}\n', "custom_id must not contain unpaired"),
        (json.dumps(line("a", messages=[{"role": "user", "content": "\ud83d"}])).encode(), "surr"),
    ],
)
def test_batch_lines_are_checked_like_the_columns(app_client, tenant, content, why):
    client = sdk(app_client, tenant.key)
    with pytest.raises(openai.BadRequestError) as exc:
        upload(client, content)
    assert exc.value.body["code"] == "invalid_batch_file" and why in exc.value.body["message"]
    assert list(client.files.list()) == []


def test_batch_lines_are_split_on_newlines_only(app_client, tenant):
    # U+2028 and U+0085 inside a JSON string are characters, not line breaks.
    content = jsonl(line("a", messages=[{"role": "user", "content": "x\u2028y\u0085z"}]))
    assert "\u2028".encode() in content
    client = sdk(app_client, tenant.key)
    f = upload(client, content.replace(b"\n", b"\r\n"))
    assert client.files.content(f.id).content == content.replace(b"\n", b"\r\n")


def test_usage_tenant_is_a_tenant_name(app_client, make_tenant):
    admin = auth(make_tenant(admin=True).key)
    for name in ("", "a\x00b", "tenA ", "x" * 65, "-lead"):
        response = app_client.get("/v1/usage", params={"tenant": name}, headers=admin)
        assert response.status_code == 400, name
        assert response.json()["error"]["param"] == "tenant"
    csv = app_client.get("/v1/usage", params={"format": "csv"}, headers=admin)
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")


def test_metrics_need_an_admin_key(app_client, make_tenant):
    assert app_client.get("/metrics").status_code == 401
    tenant_key = make_tenant().key
    forbidden = app_client.get("/metrics", headers=auth(tenant_key))
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"]
    scraped = app_client.get("/metrics", headers=auth(make_tenant(admin=True).key))
    assert scraped.status_code == 200 and "fleetlm:queue_depth" in scraped.text


def test_unknown_routes_and_methods_have_codes(app_client, tenant):
    missing = app_client.get("/v1/nothing", headers=auth(tenant.key))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = app_client.put("/v1/models", headers=auth(tenant.key))
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert "GET" in wrong.headers["allow"]


def test_the_openapi_document_describes_the_server(app_client):
    document = app_client.get("/openapi.json").json()
    assert '"422"' not in json.dumps(document)
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}}
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            for status, response in op["responses"].items():
                if int(status) >= 400 and (path, status) != ("/ready", "503"):
                    assert response["content"] == error, (method, path, status)
            if path not in ("/health", "/ready"):
                assert "401" in op["responses"] and op["security"], (method, path)
    paths = document["paths"]
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert "text/event-stream" in paths[path]["post"]["responses"]["200"]["content"]
        assert {"400", "404", "413", "429", "503"} <= set(paths[path]["post"]["responses"])
    assert "text/csv" in paths["/v1/usage"]["get"]["responses"]["200"]["content"]
    content = paths["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["application/octet-stream"]
    assert "409" in paths["/v1/batches/{batch_id}/cancel"]["post"]["responses"]
    schemas = document["components"]["schemas"]
    assert schemas["CreateBatch"]["properties"]["input_file_id"]["minLength"] == 1
    assert schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] == ["tiny"]
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    assert all(p.get("minLength") == 1 or p.get("minItems") == 1 for p in prompt)


@pytest.mark.parametrize(
    ("filename", "status"),
    [(b"a\xffb.jsonl", 200), ("é".encode() * 500, 200), ("é".encode() * 501, 400),
     (b"a\x00b.jsonl", 400)],
)  # fmt: skip
def test_raw_multipart_filenames_are_checked(app_client, tenant, filename, status):
    # Bytes as a client may send them; the column counts characters.
    boundary = b"fleetlm-boundary"
    body = b"".join(
        [
            b"--"
            + boundary
            + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n',
            b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="',
            filename + b'"\r\nContent-Type: application/jsonl\r\n\r\n',
            jsonl(line("a")) + b"\r\n--" + boundary + b"--\r\n",
        ]
    )
    headers = auth(tenant.key) | {
        "content-type": f"multipart/form-data; boundary={boundary.decode()}"
    }
    response = app_client.post("/v1/files", content=body, headers=headers)
    assert response.status_code == status, response.text
    if status == 400:
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("file", "invalid_filename")
