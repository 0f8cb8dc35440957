# What a tenant may use, per priority, as its tenant_limits rows hold it (metering/models.py), read
# with its API key (metering/keys.py). Admission reserves against these limits in Redis
# (service/limit_reservations.py).
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PriorityLimit:
    max_concurrency: int | None = None  # None: unlimited
    tokens_per_minute: int | None = None
