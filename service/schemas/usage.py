# What a response says about a request's usage: views of its one record (engine.usage's
# RequestUsage, as the worker's final event carries it). OpenAI's `usage` object, and the `usage`
# field of each streamed chunk. Without stream_options a chunk has none; with include_usage it is
# null on every chunk and the usage comes in a last chunk of its own (OpenAI); with vLLM's
# continuous_usage_stats every chunk carries the usage so far: the prompt's tokens (the cached
# ones once a worker has scheduled the request), the completion tokens generated up to that
# chunk, and on the chunk with the finish_reason the request's final usage.
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from engine.usage import RequestUsage
from service.events import Event


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    # Speculative decoding's draft tokens, in OpenAI's predicted-output fields: accepted drafts
    # are part of completion_tokens, rejected ones are not (they cost compute, not output).
    reasoning_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails

    @classmethod
    def of(cls, usage: RequestUsage) -> Usage:
        accepted = usage.spec_accepted_tokens
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
            completion_tokens_details=CompletionTokensDetails(
                accepted_prediction_tokens=accepted,
                rejected_prediction_tokens=usage.spec_proposed_tokens - accepted,
            ),
        )

    @classmethod
    def of_event(cls, event: Event) -> Usage:
        """The usage a worker's final event carries (RequestUsage.to_json())."""
        return cls.of(RequestUsage.from_json(event.get("usage")))


class ChunkUsage:
    """The usage so far of a streamed request, as its chunks report it."""

    def __init__(self, include_usage: bool, continuous: bool, prompt_tokens: int) -> None:
        self.include_usage = include_usage
        self.continuous = continuous
        self.usage = RequestUsage(prompt_tokens=prompt_tokens)

    def update(self, event: Event) -> None:
        """Takes in a worker event: a delta's counts so far, or a final event's usage."""
        if event["type"] == "delta":
            self.usage.completion_tokens = event["completion_tokens"]
            self.usage.cached_tokens = event.get("cached_tokens", self.usage.cached_tokens)
        elif "usage" in event:
            self.usage = RequestUsage.from_json(event["usage"])

    def field(self) -> dict[str, Any]:
        """What a content chunk carries, merged into it."""
        if self.continuous:
            return {"usage": Usage.of(self.usage).model_dump()}
        return {"usage": None} if self.include_usage else {}

    def final(self) -> Usage:
        return Usage.of(self.usage)
