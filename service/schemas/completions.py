# /v1/completions: the request and the response shapes (text_completion).
from __future__ import annotations

from typing import Any

from pydantic import field_validator

from service.schemas.formatter import Formatter, created_now
from service.schemas.sampling import SamplingRequest, Usage


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # the legacy endpoint's default
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str | list):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
            return v[0]
        if (isinstance(v, list) and not v) or v == "":
            raise ValueError("the prompt is empty")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return v


class CompletionFormatter(Formatter):
    def __init__(self, request_id: str, model: str) -> None:
        self.base = {
            "id": request_id,
            "object": "text_completion",
            "created": created_now(),
            "model": model,
            "system_fingerprint": None,
        }

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self.base | {"choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.base | {"choices": [], "usage": usage.model_dump()}

    def response(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self.chunk(text, finish_reason) | {"usage": usage.model_dump()}
