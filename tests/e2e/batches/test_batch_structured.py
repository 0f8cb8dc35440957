# Batch lines honour the structured-output, tool and logprobs fields as the HTTP endpoints do:
# every json_schema line's output validates, a named tool call comes back as tool_calls, a
# logprobs line carries its logprobs, and each line bills the tokens it generated.
from __future__ import annotations

import json

import jsonschema
import pytest

from tests.e2e.batches.conftest import chat_line, read_lines, submit, wait_batch
from tests.engine.test_structured_output import SCHEMAS

pytestmark = pytest.mark.timeout(600)

NUM_SCHEMA_LINES = 24
TOOL = {
    "type": "function",
    "function": {
        "name": "rate",
        "parameters": {
            "type": "object",
            "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["stars"],
            "additionalProperties": False,
        },
    },
}


def test_structured_tool_and_logprobs_lines(server):
    client = server.openai()
    lines = [
        chat_line(
            f"schema-{i}", max_tokens=400, temperature=1.0, seed=i,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "s", "schema": SCHEMAS[i % len(SCHEMAS)]}},
        )
        for i in range(NUM_SCHEMA_LINES)
    ]  # fmt: skip
    lines.append(
        chat_line(
            "tool", max_tokens=50, tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "rate"}},
        )
    )  # fmt: skip
    lines.append(chat_line("logprobs", max_tokens=4, logprobs=True, top_logprobs=2))
    batch = wait_batch(client, submit(client, lines).id, timeout_s=400)
    assert batch.status == "completed", batch
    out = {x["custom_id"]: x["response"] for x in read_lines(client, batch.output_file_id)}
    assert len(out) == len(lines)
    for i in range(NUM_SCHEMA_LINES):
        response = out[f"schema-{i}"]
        assert response["status_code"] == 200
        choice = response["body"]["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMAS[i % len(SCHEMAS)])
        usage = response["body"]["usage"]
        assert usage["completion_tokens"] > 0
    (call,) = out["tool"]["body"]["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "rate"
    jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL["function"]["parameters"])
    logprobs = out["logprobs"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == out["logprobs"]["body"]["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 2 for e in logprobs)
