# Tool calls (docs/serving.md#tool-calls): the `tools` and `tool_choice` request fields, the
# grammar that `required` and a named function put on the output, and the parsers that read a
# model's own tool-call format back out of its text (`auto`): the Hermes / Qwen
# `<tool_call>{...}</tool_call>` tags and Llama 3.x JSON calls.
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints

FunctionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
ToolCallParser = Literal["hermes", "llama3_json"]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None  # the arguments always follow `parameters` when constrained


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(slots=True, frozen=True)
class ToolMode:
    """How a chat request's answer is read: `named`: the text is the named function's arguments;
    `required`: a JSON list of {"name", "parameters"}; `auto`: the model's own format, parsed
    by `parser` (text when it holds no call)."""

    kind: Literal["auto", "required", "named"]
    parser: ToolCallParser = "hermes"
    name: str = ""


def parameters_schema(function: FunctionDef) -> dict[str, Any]:
    return function.parameters or {"type": "object", "properties": {}}


def required_schema(tools: list[Tool], parallel: bool) -> dict[str, Any]:
    """A JSON list of calls, each one of the tools with arguments valid for it (vLLM's form)."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "parameters": parameters_schema(t.function),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def parser_for_template(template: str | dict[str, str] | None) -> ToolCallParser:
    """The tool-call format a chat template teaches its model."""
    text = template if isinstance(template, str) else json.dumps(template or "")
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3_json"
    return "hermes"


@dataclass(slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def read_calls(mode: ToolMode, text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a finished answer. A call that does not parse leaves the text as
    content: the client sees what the model wrote."""
    if mode.kind == "named":
        return None, [ParsedCall(mode.name, text)]
    if mode.kind == "required":
        try:
            items = json.loads(text)
            calls = [ParsedCall(i["name"], _arguments(i.get("parameters", {}))) for i in items]
        except (ValueError, TypeError, KeyError):
            return text, []
        return None, calls
    if mode.parser == "llama3_json":
        return _read_llama3_json(text)
    return _read_hermes(text)


def may_start_call(mode: ToolMode, text: str) -> bool:
    """Whether an `auto` answer that begins with `text` may be a tool call (the stream holds it
    back until it knows)."""
    head = text.lstrip()
    if mode.kind != "auto":
        return True
    markers = ("<tool_call>",) if mode.parser == "hermes" else ("<|python_tag|>", "{")
    return any(head.startswith(m) or m.startswith(head) for m in markers)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def _read_hermes(text: str) -> tuple[str | None, list[ParsedCall]]:
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls = []
    for body in _HERMES.findall(text[start:]):
        try:
            call = json.loads(body)
            calls.append(ParsedCall(call["name"], _arguments(call.get("arguments", {}))))
        except (ValueError, TypeError, KeyError):
            return text, []
    content = text[:start].strip() or None
    return content, calls


def _read_llama3_json(text: str) -> tuple[str | None, list[ParsedCall]]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return text, []
    decoder = json.JSONDecoder()
    calls, at = [], 0
    try:
        while at < len(body):
            call, end = decoder.raw_decode(body, at)
            args = call.get("parameters", call.get("arguments", {}))
            calls.append(ParsedCall(call["name"], _arguments(args)))
            at = end
            while at < len(body) and body[at] in " \n\t;":  # several calls: `;`-separated
                at += 1
    except (ValueError, TypeError, KeyError, AttributeError):
        return text, []
    return None, calls
