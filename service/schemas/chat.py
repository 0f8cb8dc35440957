# /v1/chat/completions: the request and the response shapes (chat.completion and its chunks).
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.schemas.formatter import Formatter, created_now
from service.schemas.noop_fields import ChatNoOpFields
from service.schemas.sampling import SamplingRequest, Usage


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequest, ChatNoOpFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @field_validator("messages")
    @classmethod
    def _content_parts(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        for m in messages:
            if isinstance(m.content, list):
                for part in m.content:
                    if part.get("type") != "text":
                        raise ValueError(f"unsupported content part type {part.get('type')!r}")
        return messages

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return [
            m.model_dump(exclude_none=True) | {"content": m.content or ""} for m in self.messages
        ]


class ChatFormatter(Formatter):
    def __init__(self, request_id: str, model: str, service_tier: str) -> None:
        self.base = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created_now(),
            "model": model,
            "service_tier": service_tier,
            "system_fingerprint": None,
        }
        self.first_chunk = self._chunk({"role": "assistant", "content": ""}, None)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self.base | {"choices": [choice]}

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return self._chunk({"content": text}, finish_reason)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.base | {"choices": [], "usage": usage.model_dump()}

    def response(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        return self.base | {
            "object": "chat.completion",
            "choices": [choice],
            "usage": usage.model_dump(),
        }
