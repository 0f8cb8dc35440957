# The `usage` field of each streamed chunk. Without stream_options it is absent; with
# include_usage it is null on every chunk and the usage comes in a last chunk of its own (OpenAI);
# with vLLM's continuous_usage_stats every chunk carries the usage so far: the prompt's tokens
# (the cached ones once a worker has scheduled the request), the completion tokens generated up to
# that chunk, and on the chunk with the finish_reason the request's final usage.
from __future__ import annotations

from typing import Any

from metering.records import usage_counts
from service.events import Event
from service.schemas.sampling import Usage


class ChunkUsage:
    def __init__(self, include_usage: bool, continuous: bool, prompt_tokens: int) -> None:
        self.include_usage = include_usage
        self.continuous = continuous
        self.counts = usage_counts({"prompt_tokens": prompt_tokens})

    def update(self, event: Event) -> None:
        """Takes in a worker event: a delta's counts so far, or a final event's usage."""
        if event["type"] == "delta":
            self.counts["completion_tokens"] = event["completion_tokens"]
            self.counts["cached_tokens"] = event.get("cached_tokens", self.counts["cached_tokens"])
        elif "usage" in event:
            self.counts = event["usage"]

    def field(self) -> dict[str, Any]:
        """What a content chunk carries, merged into it."""
        if self.continuous:
            return {"usage": Usage.from_counts(self.counts).model_dump()}
        return {"usage": None} if self.include_usage else {}

    def final(self) -> Usage:
        return Usage.from_counts(self.counts)
