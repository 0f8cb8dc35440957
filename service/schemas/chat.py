# /v1/chat/completions: the request and the response shapes (chat.completion and its chunks).
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.schemas.fields import PositiveInt
from service.schemas.formatter import Formatter, created_now
from service.schemas.noop_fields import ChatNoOpFields
from service.schemas.sampling import SamplingRequest, Usage


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
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: PositiveInt | None = None

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        """Plain dicts for the chat template (content parts too); no content → ""."""
        dumped = (m.model_dump(exclude_none=True) for m in self.messages)
        return [d | {"content": d.get("content") or ""} for d in dumped]


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
