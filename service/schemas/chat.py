# /v1/chat/completions: the request and the response shapes (chat.completion and its chunks).
from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.errors import invalid_param
from service.schemas.fields import AsInteger, PositiveInt, checked
from service.schemas.formatter import Formatter, created_now
from service.schemas.noop_fields import ChatNoOpFields
from service.schemas.sampling import MAX_LOGPROBS, SamplingRequest
from service.schemas.tools import (
    Tool,
    ToolCallParser,
    ToolChoice,
    ToolMode,
    may_start_call,
    new_call_id,
    parameters_schema,
    read_calls,
    required_schema,
)
from service.schemas.usage import Usage


class TextPart(BaseModel):
    """The one content part type served: text (no images or audio)."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequest, ChatNoOpFields):
    messages: list[ChatMessage] = checked(
        "The rendered prompt fits the model's context.", ..., min_length=1
    )
    max_completion_tokens: PositiveInt | None = None
    tools: list[Tool] | None = None
    # none: "auto" with tools, else "none"
    tool_choice: ToolChoice | None = checked(
        "`auto`, `required` and a named function need `tools` (a named one must be among "
        "them); `required` and a named function take no other output constraint."
    )
    parallel_tool_calls: bool | None = None  # false: `required` makes exactly one call
    logprobs: bool | None = None  # type: ignore[assignment]  # chat: on/off, with top_logprobs
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS), AsInteger] | None = checked(
        "Above 0 only with `logprobs: true`."
    )

    def requested_logprobs(self) -> int | None:
        if not self.logprobs:
            if self.top_logprobs:
                raise invalid_param("top_logprobs", "top_logprobs needs logprobs: true")
            return None
        return self.top_logprobs or 0

    def asked_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        """Plain dicts for the chat template (content parts too); no content → "". An assistant
        turn's tool call arguments go to the template as objects, as HF templates expect."""
        dumped = [m.model_dump(exclude_none=True) for m in self.messages]
        for d in dumped:
            for call in d.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                    # (not JSON: the template gets the text the client sent)
                    with contextlib.suppress(ValueError):
                        function["arguments"] = json.loads(function["arguments"])
        return [d | {"content": d.get("content") or ""} for d in dumped]

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def effective_tool_choice(self) -> str | dict:
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        if isinstance(self.tool_choice, str):
            return self.tool_choice
        return self.tool_choice.model_dump()

    def tool_mode(self, parser: ToolCallParser) -> ToolMode | None:
        """How the answer is read; None: plain text."""
        choice = self.effective_tool_choice()
        if choice == "none":
            return None
        if not self.tools:
            raise invalid_param("tool_choice", f"tool_choice {choice!r} needs tools")
        if choice == "auto":
            return ToolMode("auto", parser)
        if choice == "required":
            return ToolMode("required", parser)
        name = choice["function"]["name"]
        if not any(t.function.name == name for t in self.tools):
            raise invalid_param("tool_choice", f"tool_choice names {name!r}, not among tools")
        return ToolMode("named", parser, name)

    def structured_output(self) -> tuple[str, dict[str, str]] | None:
        """`required` and a named function constrain the answer to valid arguments."""
        asked = super().structured_output()
        mode = self.tool_mode("hermes")
        if mode is None or mode.kind == "auto":
            return asked
        if asked is not None:
            raise invalid_param(
                "tool_choice", f"tool_choice and {asked[0]} both constrain the output"
            )
        if mode.kind == "named":
            (tool,) = [t for t in self.tools if t.function.name == mode.name]
            schema = parameters_schema(tool.function)
        else:
            schema = required_schema(self.tools, self.parallel_tool_calls is not False)
        spec = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        return "tools", {"kind": "json_schema", "spec": spec}  # `tools`: their schemas failed


class ChatFormatter(Formatter):
    def __init__(
        self, request_id: str, model: str, service_tier: str, tool_mode: ToolMode | None = None
    ) -> None:
        self.base = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created_now(),
            "model": model,
            "service_tier": service_tier,
            "system_fingerprint": None,
        }
        self.first_chunk = self._chunk({"role": "assistant", "content": ""}, None)
        self.tool_mode = tool_mode
        # Streaming with tools: text held back while it may still be a tool call.
        self._held = ""
        self._holding = tool_mode is not None

    def for_choice(self, index: int) -> ChatFormatter:
        twin = super().for_choice(index)
        twin.first_chunk = twin._chunk({"role": "assistant", "content": ""}, None)
        return twin

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None, logprobs: list | None = None
    ) -> dict[str, Any]:
        choice = {
            "index": self.index,
            "delta": delta,
            "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
            "finish_reason": finish_reason,
        }
        return self.base | {"choices": [choice]}

    def chunk(
        self, text: str, finish_reason: str | None, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        return self._chunk({"content": text}, finish_reason, logprobs)

    def feed(self, text: str) -> str:
        if not self._holding:
            return text
        self._held += text
        if may_start_call(self.tool_mode, self._held):
            return ""
        self._holding = False  # plain text after all: let it all go
        held, self._held = self._held, ""
        return held

    def closing_chunks(
        self, text: str, finish_reason: str, logprobs: list[dict] | None = None
    ) -> list[dict[str, Any]]:
        text = self.feed(text)
        if not self._holding:
            return [self.chunk(text, finish_reason, logprobs)]
        content, calls = read_calls(self.tool_mode, self._held)
        if not calls:
            return [self.chunk(content or "", finish_reason)]
        chunks = [self.chunk(content, None)] if content else []
        for i, call in enumerate(calls):
            head = {"index": i, "id": new_call_id(), "type": "function"}
            function = {"name": call.name, "arguments": ""}
            chunks.append(self._chunk({"tool_calls": [head | {"function": function}]}, None))
            arguments = {"index": i, "function": {"arguments": call.arguments}}
            chunks.append(self._chunk({"tool_calls": [arguments]}, None))
        chunks.append(self._chunk({}, _calls_finish(finish_reason)))
        return chunks

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.base | {"choices": [], "usage": usage.model_dump()}

    def response(
        self, text: str, finish_reason: str, usage: Usage, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if self.tool_mode is not None:
            content, calls = read_calls(self.tool_mode, text)
            if calls:
                message["content"] = content
                message["tool_calls"] = [
                    {"id": new_call_id(), "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]  # fmt: skip
                finish_reason = _calls_finish(finish_reason)
        choice = {
            "index": self.index,
            "message": message,
            "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
            "finish_reason": finish_reason,
        }
        return self.base | {
            "object": "chat.completion",
            "choices": [choice],
            "usage": usage.model_dump(),
        }


def _calls_finish(finish_reason: str) -> str:
    return "tool_calls" if finish_reason == "stop" else finish_reason
