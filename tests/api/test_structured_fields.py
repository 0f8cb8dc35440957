# The structured-output fields at the API (docs/serving.md#structured-outputs): each form
# reaches the worker as one structured_output spec; a schema, regex or grammar that the grammar
# engine cannot compile, two fields asking at once, or a malformed value is a 400 naming the
# field, before anything is queued.
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.sampling_params import StructuredOutput
from tests.api.conftest import bad_request, sdk

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["city"],
}
PLACE = {"name": "place", "schema": SCHEMA, "strict": True}
CANONICAL = json.dumps(SCHEMA, sort_keys=True, separators=(",", ":"))


def _post(app_client, key: str, body: dict, path: str = "/v1/chat/completions"):
    base = {"messages": MESSAGES} if path == "/v1/chat/completions" else {"prompt": "hi"}
    return app_client.post(
        path,
        json={"model": "tiny", **base, **body},
        headers={"Authorization": f"Bearer {key}"},
    )


def _queued_spec(app_client, tenant, worker, body: dict, path="/v1/chat/completions"):
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(_post, app_client, tenant.key, body | {"max_tokens": 3}, path)
        queued = worker.take(tenant)
        worker.publish(queued.request_id, worker.done("{}", len(queued.prompt_token_ids), 1))
        assert reply.result(timeout=30).status_code == 200
    spec = queued.sampling.structured_output
    return None if spec is None else {"kind": spec.kind, "spec": spec.spec}


@pytest.mark.parametrize(
    ("body", "expected", "path"),
    [
        ({"response_format": {"type": "json_object"}}, {"kind": "json_object", "spec": ""}, None),
        (
            {"response_format": {"type": "json_schema", "json_schema": PLACE}},
            {"kind": "json_schema", "spec": CANONICAL},
            None,
        ),
        ({"guided_json": json.dumps(SCHEMA)}, {"kind": "json_schema", "spec": CANONICAL}, None),
        ({"guided_regex": "[a-z]+"}, {"kind": "regex", "spec": "[a-z]+"}, "/v1/completions"),
        ({"guided_choice": ["yes", "no"]}, {"kind": "choice", "spec": '["yes", "no"]'}, None),
        ({"guided_grammar": 'start: "x"+'}, {"kind": "grammar", "spec": 'start: "x"+'}, None),
        ({"structured_outputs": {"json": SCHEMA}}, {"kind": "json_schema", "spec": CANONICAL},
         "/v1/completions"),
        ({"structured_outputs": {"choice": ["a"]}}, {"kind": "choice", "spec": '["a"]'}, None),
        ({"response_format": {"type": "text"}}, None, None),
    ],
)  # fmt: skip
def test_each_form_reaches_the_worker(app_client, tenant, worker, body, expected, path):
    spec = _queued_spec(app_client, tenant, worker, body, path or "/v1/chat/completions")
    assert spec == expected


def test_the_sdk_sends_response_format_json_schema(app_client, tenant, worker):
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            client.chat.completions.create,
            model="tiny",
            messages=MESSAGES,
            max_tokens=3,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "place", "schema": SCHEMA, "strict": True},
            },
        )
        queued = worker.take(tenant)
        worker.publish(queued.request_id, worker.done('{"city":"x"}', 3, 3))
        assert json.loads(reply.result(timeout=30).choices[0].message.content) == {"city": "x"}
    assert queued.sampling.structured_output == StructuredOutput("json_schema", CANONICAL)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
         "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format"),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "bad name!", "schema": SCHEMA}}},
         "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_object", "json_schema": {"name": "x"}}},
         "response_format"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": "(["}, "guided_regex"),
        ({"guided_grammar": "start: ???"}, "guided_grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"yaml": "a"}}, "structured_outputs"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
)  # fmt: skip
def test_what_cannot_be_compiled_or_is_malformed_is_a_400_naming_the_field(
    app_client, tenant, body, param
):
    assert bad_request(app_client, tenant.key, body)["param"] == param
