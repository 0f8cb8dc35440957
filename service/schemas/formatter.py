# The response shapes of a generation endpoint: chat.completion(.chunk) or text_completion, built
# from the relayed text, the finish reason and the usage. The API streams or collects them; the
# batch runner writes a finished line's response with the same formatter.
from __future__ import annotations

import copy
import time
from typing import Any

from service.schemas.usage import Usage


class Formatter:
    """Endpoint-specific shapes: chat.completion(.chunk) or text_completion, of one choice."""

    first_chunk: dict[str, Any] | None = None  # sent before any token (the chat role delta)
    index = 0  # the choice's (n > 1: service/schemas/choices.py makes one formatter each)

    def for_choice(self, index: int) -> Formatter:
        """A fresh formatter like this one (which has formatted nothing yet) for choice `index`."""
        twin = copy.copy(self)
        twin.index = index
        return twin

    # `logprobs`: the tokens' entries as the worker sends them (service/events.py), or None.
    def chunk(
        self, text: str, finish_reason: str | None, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def feed(self, text: str) -> str:
        """A streamed delta's text → what to send now (a formatter may hold text back)."""
        return text

    def event_logprobs(self, event: dict) -> list[dict] | None:
        """The logprob entries an output event brings to this response (or None)."""
        return event.get("logprobs")

    def closing_chunks(
        self, text: str, finish_reason: str, logprobs: list[dict] | None = None
    ) -> list[dict[str, Any]]:
        """The chunks that end a stream: its last text, with the finish reason."""
        return [self.chunk(self.feed(text), finish_reason, logprobs)]

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        raise NotImplementedError

    def response(
        self, text: str, finish_reason: str, usage: Usage, logprobs: list[dict] | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError


def created_now() -> int:
    return int(time.time())
