# Tool calls at the API with the openai SDK (the test plays the worker): tools reach the chat
# template, `required` and a named function send the worker a grammar, an answer in the model's
# tool-call format comes back as `tool_calls` with finish_reason "tool_calls", streamed as deltas
# that the SDK's stream accumulator rebuilds into the non-streamed message; bad tool fields are
# 400s naming the field.
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import bad_request, sdk

pytestmark = pytest.mark.timeout(60)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]
# The "tiny" model's template is ChatML without tools: the parser is Hermes (the default).
ANSWER = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'


def _play(app_client, tenant, worker, call, answer: str = ANSWER):
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(call, client)
        queued = worker.take(tenant)
        n = len(queued.prompt_token_ids)
        worker.publish(queued.request_id, worker.delta(answer[:9], 1))
        done = worker.done(answer[9:], n, 2) | {"finish_reason": "stop"}
        worker.publish(queued.request_id, done)
        return queued, reply.result(timeout=30)


def test_an_auto_answer_in_the_models_format_is_a_tool_call(app_client, tenant, worker):
    def call(client):
        return client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=50
        )

    queued, out = _play(app_client, tenant, worker, call)
    assert queued.sampling.structured_output is None  # auto: the model's own format, parsed
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (tc,) = choice.message.tool_calls
    assert tc.type == "function" and tc.id.startswith("call_")
    assert (tc.function.name, json.loads(tc.function.arguments)) == (
        "weather",
        {"city": "Oslo", "days": 2},
    )


def test_streamed_tool_calls_rebuild_to_the_non_streamed_ones(app_client, tenant, worker):
    def whole(client):
        return client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=50
        )

    def streamed(client):
        with client.chat.completions.stream(
            model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=50
        ) as stream:
            for _ in stream:
                pass
            return stream.get_final_completion()

    _, a = _play(app_client, tenant, worker, whole)
    _, b = _play(app_client, tenant, worker, streamed)
    calls = [
        [(t.function.name, t.function.arguments) for t in out.choices[0].message.tool_calls]
        for out in (a, b)
    ]
    assert calls[0] == calls[1]
    assert b.choices[0].finish_reason == "tool_calls"


def test_plain_text_with_tools_streams_as_content(app_client, tenant, worker):
    def streamed(client):
        stream = client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=50, stream=True
        )
        return list(stream)

    _, chunks = _play(app_client, tenant, worker, streamed, answer="Sunny all week in Oslo.")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Sunny all week in Oslo."
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "weather"}}]
)
def test_required_and_named_send_the_parameters_grammar(app_client, tenant, worker, choice):
    named = isinstance(choice, dict)
    answer = '{"city":"Oslo"}' if named else '[{"name":"weather","parameters":{"city":"Oslo"}}]'

    def call(client):
        return client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=50
        )

    queued, out = _play(app_client, tenant, worker, call, answer)
    spec = queued.sampling.structured_output
    assert spec.kind == "json_schema"
    schema = json.loads(spec.spec)
    if named:
        assert schema == TOOLS[0]["function"]["parameters"]
    else:
        assert schema["items"]["anyOf"][0]["properties"]["name"] == {"const": "weather"}
    (tc,) = out.choices[0].message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("weather", {"city": "Oslo"})


def test_tool_results_go_through_the_template(app_client, tenant, worker):
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]

    def call(client):
        return client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, max_tokens=50
        )

    queued, out = _play(app_client, tenant, worker, call, answer="It is sunny.")
    assert out.choices[0].message.content == "It is sunny."
    assert b"Sunny, 21 C" in bytes(t for t in queued.prompt_token_ids if t < 256)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "$ref": "#/nowhere"}}}], "tool_choice": "required"}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)  # fmt: skip
def test_bad_tool_fields_are_400s_naming_them(app_client, tenant, body, param):
    assert bad_request(app_client, tenant.key, body)["param"] == param
