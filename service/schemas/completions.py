# /v1/completions: the request and the response shapes (text_completion).
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, field_validator

from service.errors import invalid_param
from service.schemas.fields import NonEmptyStr, NonNegativeInt, OnlyOne, checked
from service.schemas.formatter import Formatter, created_now
from service.schemas.sampling import SamplingRequest
from service.schemas.usage import Usage

TokenIds = Annotated[list[NonNegativeInt], Field(min_length=1)]
# One prompt per request: a non-empty string or token ids, bare or as a one-element list.
Prompt = (
    NonEmptyStr
    | TokenIds
    | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=1)]
    | Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
)


class CompletionRequest(SamplingRequest):
    prompt: Prompt = checked(
        "Token ids of the model's vocabulary; the prompt's tokens and max_tokens fit the "
        "model's context.",
        ...,
    )
    # The legacy endpoint's default is 16; 0 (with echo) scores the prompt and generates nothing.
    max_tokens: NonNegativeInt | None = checked("0 only with `echo: true`.", 16)
    # A strict bool (0 is not false, as 1 is not true): the prompt's text (and with logprobs its
    # tokens' logprobs) comes first.
    echo: StrictBool = False
    suffix: Literal[""] | None = Field(None, description="Not supported.")
    best_of: OnlyOne | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list) -> str | list[int]:
        if isinstance(v, list) and isinstance(v[0], str | list):
            return v[0]
        return v

    def check_n(self, max_n: int) -> None:
        super().check_n(max_n)
        if self.best_of is not None and self.n > self.best_of:
            raise invalid_param(
                "n",
                "n must not exceed best_of (only best_of 1 is supported: leave best_of out to "
                "ask for n choices)",
            )
        if self.n > 1 and self.max_tokens == 0:
            raise invalid_param("n", "n > 1 needs max_tokens of at least 1 (0 scores the prompt)")

    def check_max_tokens(self) -> None:
        if self.max_tokens == 0 and not self.echo:
            raise invalid_param(
                "max_tokens", "max_tokens 0 is only allowed with echo (to score the prompt)"
            )

    def engine_prompt_logprobs(self) -> int | None:
        """What the engine computes for the prompt: echo with logprobs wants the prompt's, and
        max_tokens 0 has nothing else to compute."""
        if self.echo and self.logprobs is not None:
            return self.logprobs
        return 0 if self.max_tokens == 0 else None


@dataclass(slots=True, frozen=True)
class Echo:
    """What an echoing completion puts first: the prompt's text and its first token's text (the
    one token without a logprob)."""

    text: str
    first_token: str


class CompletionFormatter(Formatter):
    def __init__(
        self, request_id: str, model: str, echo: Echo | None = None, logprobs: bool = False
    ) -> None:
        self.base = {
            "id": request_id,
            "object": "text_completion",
            "created": created_now(),
            "model": model,
            "system_fingerprint": None,
        }
        self.text_offset = 0  # characters sent so far: the legacy logprobs' text_offset
        self.echo = echo  # sent with the first text, then None
        self.echo_sent: Echo | None = None
        self.logprobs = logprobs

    def feed(self, text: str) -> str:
        if self.echo is not None:
            text, self.echo_sent = self.echo.text + text, self.echo
            self.echo = None
        return text

    def event_logprobs(self, event: dict) -> list[dict] | None:
        if not self.logprobs:
            return None
        entries = event.get("logprobs", [])
        prompt = event.get("prompt_logprobs")
        echo = self.echo_sent or self.echo  # (collecting: the text is fed only at the end)
        if prompt is not None and echo is not None:
            first = {"token": echo.first_token, "logprob": None, "top_logprobs": None}
            entries = [first, *prompt, *entries]
        return entries or None

    def chunk(
        self, text: str, finish_reason: str | None, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        choice = {
            "index": self.index,
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
                None
                if e["top_logprobs"] is None  # the echoed prompt's first token
                else {t["token"]: t["logprob"] for t in e["top_logprobs"]}
                for e in entries
            ],
            "text_offset": offsets,
        }

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.base | {"choices": [], "usage": usage.model_dump()}

    def response(
        self, text: str, finish_reason: str, usage: Usage, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        text = self.feed(text)
        return self.chunk(text, finish_reason, logprobs) | {"usage": usage.model_dump()}
