# A request's priority, the one shape every room uses: the engine schedules by it, the queue
# message, the Redis names (fleetlm:q:{priority}) and the usage row carry its value. Torch-free
# (service/ imports it). The HTTP edge maps OpenAI's service_tier onto it
# (service/schemas/sampling.py); the batch runner's lines are BATCH.
from __future__ import annotations

import enum


class Priority(enum.StrEnum):
    # Declared in serving order: interactive traffic is admitted before batch traffic, and
    # batch requests are the first victims under KV pressure. Iterating the enum, and `rank`,
    # give that order (a StrEnum's own `<` compares the names, never sort by it).
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """Lower is served first."""
        return _RANK[self]

    @classmethod
    def parse(cls, value: Priority | str | int) -> Priority:
        """A member from its value ("batch"), its name ("BATCH") or its rank (1)."""
        if isinstance(value, int):
            return tuple(cls)[value]
        try:
            return cls(value.lower())
        except ValueError:
            raise ValueError(f"priority must be 'interactive' or 'batch', got {value!r}") from None


_RANK = {priority: rank for rank, priority in enumerate(Priority)}
PRIORITIES: tuple[Priority, ...] = tuple(Priority)  # serving order: the order queues are read in
