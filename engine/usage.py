# A request's usage: the one typed record of its counters from the engine to its usage_records
# row. The engine fills it from the request's counters (engine/core/step_outputs.py); the
# worker bills it (workers/gpu/inflight.py) and puts its JSON on the final event and in the metering
# record; metering writes each counter to the usage_records column of the same name (it imports
# no engine, so it carries the counters by name and never lists them); the OpenAI usage and the
# streamed chunk's usage are views of it (service/schemas/usage.py). Torch-free: service/
# imports it.
#
# Adding a usage counter touches the engine (count it on the Request and set it where
# step_outputs builds this record), a field here, and a migration adding its usage_records
# column (with the column's line in metering/models.py). Nothing else: every room between
# carries the record whole.
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields


@dataclass(slots=True)
class RequestUsage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # part of prompt_tokens: prefix-cache hits
    completion_tokens: int = 0
    preemptions: int = 0
    # Speculative decoding: draft tokens proposed for this request and, of those, accepted
    # (accepted ones are in completion_tokens; the rest cost GPU time but are not billed).
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0

    def to_json(self) -> dict[str, int]:
        """Its wire form (output events, metering records): every counter by name."""
        return asdict(self)

    @classmethod
    def from_json(cls, counts: Mapping[str, object] | None, **absent: int) -> RequestUsage:
        """From its wire form: every counter as an int; where absent, `absent`'s value or zero
        (a request that never ran knows none). A name this version does not know is dropped."""
        counts = counts or {}
        return cls(**{f.name: int(counts.get(f.name, absent.get(f.name, 0))) for f in _FIELDS})


_FIELDS = fields(RequestUsage)
