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
