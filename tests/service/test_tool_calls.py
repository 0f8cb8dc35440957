# Reading tool calls back out of an answer (service/schemas/tools.py): the Hermes / Qwen tags and
# Llama 3.x JSON calls of `auto`, the constrained forms of `required` and a named function, and
# the stream's hold-back rule. The engine-level test produces each format with the model's
# output forced by a grammar, so the parser reads what an engine really emits.
from __future__ import annotations

import json

import pytest

from engine import LLM, SamplingParams
from engine.sampling_params import StructuredOutput
from service.schemas.chat import ChatCompletionRequest, ChatFormatter
from service.schemas.tools import ToolMode, may_start_call, parser_for_template, read_calls
from service.schemas.usage import Usage

HERMES = ToolMode("auto", "hermes")
LLAMA = ToolMode("auto", "llama3_json")
WEATHER = {"city": "Paris", "days": 3}


def test_hermes_tags_become_calls_and_the_text_before_them_content():
    text = (
        'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", "days": 3}}'
        '\n</tool_call>\n<tool_call>\n{"name": "time", "arguments": {}}\n</tool_call>'
    )
    content, calls = read_calls(HERMES, text)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("weather", WEATHER),
        ("time", {}),
    ]


def test_llama3_json_calls_with_and_without_python_tag():
    for text in (
        '{"name": "weather", "parameters": {"city": "Paris", "days": 3}}',
        '<|python_tag|>{"name": "weather", "parameters": {"city": "Paris", "days": 3}}',
    ):
        content, calls = read_calls(LLAMA, text)
        assert content is None
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", WEATHER)]
    _, calls = read_calls(LLAMA, '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}')
    assert [c.name for c in calls] == ["a", "b"]


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (HERMES, "Just text, no call."),
        (HERMES, "<tool_call>{not json</tool_call>"),
        (LLAMA, "The weather is fine."),
        (LLAMA, '{"no_name": 1}'),
    ],
)
def test_what_is_not_a_call_stays_text(mode, text):
    assert read_calls(mode, text) == (text, [])


def test_constrained_forms():
    named = ToolMode("named", name="weather")
    assert read_calls(named, '{"city":"Paris"}')[1][0].arguments == '{"city":"Paris"}'
    required = ToolMode("required")
    _, calls = read_calls(required, '[{"name":"weather","parameters":{"city":"Paris","days":3}}]')
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", WEATHER)]


def test_the_stream_holds_back_only_what_may_be_a_call():
    assert may_start_call(HERMES, "  <tool")
    assert may_start_call(HERMES, "<tool_call>{")
    assert not may_start_call(HERMES, "Sure")
    assert may_start_call(LLAMA, "{")
    assert not may_start_call(LLAMA, "The")


def test_the_parser_follows_the_chat_template():
    assert parser_for_template("... <tool_call>\n{{ tool }} </tool_call>") == "hermes"
    assert parser_for_template("{{ '<|python_tag|>' }} ipython") == "llama3_json"
    assert parser_for_template(None) == "hermes"


def test_streamed_chunks_carry_what_the_response_carries():
    text = (
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    )
    usage = Usage(
        prompt_tokens=1, completion_tokens=1, total_tokens=2,
        prompt_tokens_details={}, completion_tokens_details={},
    )  # fmt: skip
    whole = ChatFormatter("id", "m", "default", HERMES).response(text, "stop", usage)
    fmt = ChatFormatter("id", "m", "default", HERMES)
    assert [fmt.feed(t) for t in (text[:5], text[5:20])] == ["", ""]
    chunks = fmt.closing_chunks(text[20:], "stop")
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    deltas = [c["choices"][0]["delta"] for c in chunks]
    name = deltas[0]["tool_calls"][0]["function"]["name"]
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[:2])
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert (name, arguments) == (call["function"]["name"], call["function"]["arguments"])
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    plain = ChatFormatter("id", "m", "default", HERMES)
    assert plain.feed("Hello") == "Hello"  # not a call: streamed at once


def test_required_and_named_choices_constrain_to_the_parameters():
    tools = [
        {"type": "function", "function": {"name": "weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "time"}},
    ]  # fmt: skip
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    named = ChatCompletionRequest.model_validate(
        base | {"tool_choice": {"type": "function", "function": {"name": "weather"}}}
    )
    param, spec = named.structured_output()
    assert param == "tools"
    assert json.loads(spec["spec"]) == tools[0]["function"]["parameters"]
    required = ChatCompletionRequest.model_validate(
        base | {"tool_choice": "required", "parallel_tool_calls": False}
    )
    schema = json.loads(required.structured_output()[1]["spec"])
    assert schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    assert ChatCompletionRequest.model_validate(base).structured_output() is None  # auto


@pytest.fixture(scope="module")
def tiny():
    return LLM("tiny", device="cpu", num_kv_blocks=64)


@pytest.mark.parametrize(
    ("mode", "forced"),
    [
        (HERMES, 'On it.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}'
                 "\n</tool_call>"),
        (LLAMA, '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}'),
    ],
)  # fmt: skip
def test_an_auto_call_the_engine_emits_is_parsed(tiny, mode, forced):
    # The model's output forced to the format, token by token, by a one-string grammar.
    params = SamplingParams(
        temperature=1.0, max_tokens=200, skip_special_tokens=False,
        structured_output=StructuredOutput("choice", json.dumps([forced])),
    )  # fmt: skip
    out = tiny.generate([[1, 2, 3]], params)[0]
    assert out.text == forced
    content, calls = read_calls(mode, out.text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", {"city": "Oslo"})]
    assert content == ("On it." if mode is HERMES else None)
