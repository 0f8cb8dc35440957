# metering/ stores priorities as text and imports no engine: its names must be the enum's.
from __future__ import annotations

from engine.priority import PRIORITIES, Priority
from metering import tenants


def test_limits_are_kept_for_exactly_the_engine_priorities_in_serving_order():
    assert tuple(p.value for p in PRIORITIES) == tenants.PRIORITIES
    assert [p.rank for p in Priority] == [0, 1] and Priority.parse(1) is Priority.BATCH
    assert Priority.parse("BATCH") is Priority.BATCH and f"{Priority.BATCH}" == "batch"
