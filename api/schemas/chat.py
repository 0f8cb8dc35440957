# /v1/chat/completions request shape (responses are built in routes/chat.py).
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.schemas.sampling import SamplingRequest


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequest):
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
