# What a GPU worker counts over its life, written into its stats hash every round trip
# (workers/gpu/round_trip.py): the routers and the API read them.
from __future__ import annotations

from dataclasses import dataclass, field

from workers.gpu.work_intake import HOW


@dataclass(slots=True)
class WorkerCounts:
    num_steps: int = 0
    last_cancel_step: int = -1  # the step after which the last cancel freed its KV blocks
    taken: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HOW, 0))  # by how
