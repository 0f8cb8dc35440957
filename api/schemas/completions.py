# /v1/completions request shape (responses are built in routes/completions.py).
from __future__ import annotations

from pydantic import field_validator

from api.schemas.sampling import SamplingRequest


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
