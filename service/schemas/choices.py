# The n choices of one request (`n` > 1) on the way out. Its output stream interleaves the
# choices' events (service/events.py: each names its `index`; a choice that ends before the
# others says so with a `finish_reason` on its last delta; the final event carries every
# choice's finish reason). One formatter per choice, each writing its own index, turns them into
# chunks or, collected, into one response with n choices. With n = 1 all of this is the one
# formatter as it always was.
from __future__ import annotations

from typing import Any

from service.events import Event
from service.schemas.formatter import Formatter
from service.schemas.usage import Usage


class Choices:
    def __init__(self, fmt: Formatter, n: int) -> None:
        self.formatters = [fmt] if n == 1 else [fmt.for_choice(i) for i in range(n)]
        self.ended = [False] * n
        self._prompt_logprobs: list[dict] | None = None
        self._started = [False] * n

    @property
    def n(self) -> int:
        return len(self.formatters)

    def of(self, event: Event) -> tuple[int, Formatter]:
        """The choice an event belongs to, and its formatter. The prompt's logprobs (an echo
        with logprobs) come with choice 0's first event: every choice's first one gets them."""
        index = event.get("index", 0)
        if self.n > 1 and event["type"] != "error":
            if "prompt_logprobs" in event and self._prompt_logprobs is None:
                self._prompt_logprobs = event["prompt_logprobs"]
            if not self._started[index] and self._prompt_logprobs is not None:
                event.setdefault("prompt_logprobs", self._prompt_logprobs)
            self._started[index] = True
        return index, self.formatters[index]

    def first_chunks(self) -> list[dict[str, Any]]:
        return [f.first_chunk for f in self.formatters if f.first_chunk is not None]

    def closing_chunks(self, event: Event) -> list[dict[str, Any]]:
        """What ends choices: a delta that ends its choice, or the final event (its own choice's
        text, then every choice not ended yet)."""
        index, fmt = self.of(event)
        reasons = event.get("finish_reasons") or [event["finish_reason"]] * self.n
        chunks = []
        if not self.ended[index]:
            self.ended[index] = True
            reason = reasons[index] if event["type"] == "done" else event["finish_reason"]
            chunks += fmt.closing_chunks(event.get("text", ""), reason, fmt.event_logprobs(event))
        if event["type"] == "done":
            for i, ended in enumerate(self.ended):
                if not ended:
                    self.ended[i] = True
                    chunks += self.formatters[i].closing_chunks("", reasons[i])
        return chunks

    def response(self, events: list[Event], usage: Usage) -> dict[str, Any]:
        """The whole response of a request that finished (`events`: what its stream delivered,
        the final `done` last)."""
        final = events[-1]
        texts: list[list[str]] = [[] for _ in range(self.n)]
        logprobs: list[list[dict]] = [[] for _ in range(self.n)]
        for event in events:
            index, fmt = self.of(event)
            texts[index].append(event.get("text", ""))
            logprobs[index].extend(fmt.event_logprobs(event) or ())
        reasons = final.get("finish_reasons") or [final["finish_reason"]] * self.n
        bodies = [
            fmt.response("".join(texts[i]), reasons[i], usage, logprobs[i] or None)
            for i, fmt in enumerate(self.formatters)
        ]
        body = bodies[0]
        if self.n > 1:
            body["choices"] = [b["choices"][0] for b in bodies]
        return body
