# /v1/completions: the request and the response shapes (text_completion).
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from service.schemas.fields import NonEmptyStr, NonNegativeInt, OnlyOne, PositiveInt
from service.schemas.formatter import Formatter, created_now
from service.schemas.sampling import SamplingRequest, Usage

TokenIds = Annotated[list[NonNegativeInt], Field(min_length=1)]
# One prompt per request: a non-empty string or token ids, bare or as a one-element list.
Prompt = (
    NonEmptyStr
    | TokenIds
    | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=1)]
    | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
)


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: PositiveInt | None = 16  # the legacy endpoint's default
    echo: Literal[False] = Field(False, description="Not supported.")
    suffix: Literal[""] | None = Field(None, description="Not supported.")
    best_of: OnlyOne | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list) -> str | list[int]:
        if isinstance(v, list) and isinstance(v[0], str | list):
            return v[0]
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
        self.text_offset = 0  # characters sent so far: the legacy logprobs' text_offset

    def chunk(
        self, text: str, finish_reason: str | None, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None if logprobs is None else self._legacy(logprobs),
            "finish_reason": finish_reason,
        }
        return self.base | {"choices": [choice]}

    def _legacy(self, entries: list[dict]) -> dict[str, Any]:
        """The completions endpoint's logprobs shape, from the chat-shaped entries."""
        offsets = []
        for e in entries:
            offsets.append(self.text_offset)
            self.text_offset += len(e["token"])
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries
            ],
            "text_offset": offsets,
        }

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.base | {"choices": [], "usage": usage.model_dump()}

    def response(
        self, text: str, finish_reason: str, usage: Usage, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        return self.chunk(text, finish_reason, logprobs) | {"usage": usage.model_dump()}
