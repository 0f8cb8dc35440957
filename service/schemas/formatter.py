# The response shapes of a generation endpoint: chat.completion(.chunk) or text_completion, built
# from the relayed text, the finish reason and the usage. The API streams or collects them; the
# batch runner writes a finished line's response with the same formatter.
from __future__ import annotations

import time
from typing import Any

from service.schemas.sampling import Usage


class Formatter:
    """Endpoint-specific shapes: chat.completion(.chunk) or text_completion."""

    first_chunk: dict[str, Any] | None = None  # sent before any token (the chat role delta)

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        raise NotImplementedError

    def response(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        raise NotImplementedError


def created_now() -> int:
    return int(time.time())
