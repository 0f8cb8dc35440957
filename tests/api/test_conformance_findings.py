# What schemathesis found against the OpenAPI document, each fixed at its cause: a 405 lists
# every method the path serves in `Allow`; `echo` takes booleans only (0 is refused as 1 is);
# a usage range whose end is not after its start is an empty range, not a 400; an upload's file
# is documented as a non-empty batch input file, which is what is refused otherwise.
from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_405_lists_every_method_of_the_path(app_client, tenant):
    # GET /v1/files and POST /v1/files are two routes: Allow names both.
    wrong = app_client.put("/v1/files", headers=auth(tenant.key))
    assert wrong.status_code == 405, wrong.text
    allowed = {m.strip() for m in wrong.headers["allow"].split(",")}
    assert {"GET", "POST"} <= allowed, allowed
    assert wrong.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("echo", [0, 1, 0.0, "false"])
def test_echo_is_a_strict_boolean(app_client, tenant, echo):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, "echo": echo}
    refused = app_client.post("/v1/completions", headers=auth(tenant.key), json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "echo"


def test_a_usage_range_ending_before_it_starts_is_empty(app_client, tenant):
    r = app_client.get(
        "/v1/usage", headers=auth(tenant.key), params={"start": "2026-05-02", "end": "2026-05-01"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"] == []


def test_the_document_says_an_upload_is_a_non_empty_batch_file(app_client, tenant):
    document = app_client.get("/openapi.json").json()
    bodies = [s for n, s in document["components"]["schemas"].items() if "upload_file" in n]
    assert bodies and bodies[0]["properties"]["file"]["minLength"] == 1
    files = {"file": ("empty.jsonl", b"")}
    empty = app_client.post(
        "/v1/files", headers=auth(tenant.key), files=files, data={"purpose": "batch"}
    )
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "invalid_batch_file"


@pytest.mark.parametrize(
    ("field", "value"),
    [("store", 0), ("echo", 0), ("use_beam_search", 0), ("prompt_logprobs", False)],
)
def test_a_no_op_field_takes_its_json_type_only(app_client, tenant, field, value):
    # 0 == False in Python; in JSON a boolean is not a number, as the document's const says.
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], field: value}
    refused = app_client.post("/v1/chat/completions", headers=auth(tenant.key), json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == field
    document = app_client.get("/openapi.json").json()
    prop = document["components"]["schemas"]["ChatCompletionRequest"]["properties"][field]
    assert {"type": "null"} in prop["anyOf"] and len(prop["anyOf"]) == 2, prop


@pytest.mark.parametrize("start", ["0.0", "1700000000", "2026-05-01T00:00:00"])
def test_a_usage_day_is_written_as_a_date(app_client, tenant, start):
    r = app_client.get("/v1/usage", headers=auth(tenant.key), params={"start": start})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "start"


def test_the_document_marks_the_rules_json_schema_cannot_state(app_client):
    schemas = app_client.get("/openapi.json").json()["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    for field in ("messages", "stop_token_ids", "logit_bias", "guided_regex", "tool_choice"):
        assert chat[field]["x-checked"], field
    assert "x-checked" not in chat["temperature"]  # its bounds are the schema's own
    assert schemas["CreateBatch"]["properties"]["input_file_id"]["x-checked"]
    options = schemas["StreamOptions"]["properties"]["include_obfuscation"]
    assert options["const"] is False
    metadata = schemas["CreateBatch"]["properties"]["metadata"]["anyOf"][0]
    assert metadata["additionalProperties"]["type"] == "string"  # every key's value, NUL or not
