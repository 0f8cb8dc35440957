# The tokens-per-minute window of the reservation script (service/limit_reservations.py), on the
# embedded Redis: a sliding 60-second window estimated from two minute counters.
from __future__ import annotations

import time
import uuid

from metering.ratelimit import PriorityLimit
from service import limit_reservations as rl


def test_token_window_slides_over_the_minute_boundary(rds):
    # Script-level: the previous minute's tokens still count, weighted by the share of that
    # minute inside the last 60 s. Fixed windows would admit here (this minute is empty).
    if time.time() % 60 > 45:  # the previous minute's weight must stay large for the check
        time.sleep(61 - time.time() % 60)
    r = rds
    tenant = f"test-{uuid.uuid4().hex[:6]}"
    minute = int(time.time() // 60)
    previous = rl.window_key(tenant, "interactive", minute - 1)
    r.set(previous, 10_000)  # ten times the limit, all in the previous minute

    def reserve(tokens: int, request_id: str) -> rl.Decision:
        limit = PriorityLimit(tokens_per_minute=1000)
        return rl.decision(
            r.eval(*rl.reserve_call(tenant, "interactive", limit, request_id, tokens, 60))
        )

    elapsed = time.time() % 60
    d = reserve(1, "a")
    assert not d.admitted and d.exceeded == "tokens"
    # Weighted previous minute: 10,000 × (1 - elapsed / 60), at least 2,500 here.
    assert abs(d.tokens_used - 10_000 * (1 - elapsed / 60)) < 10_000 * 2 / 60
    # It fits once that share decays below 999 tokens: (used - 999) / (10,000 / 60) seconds.
    expected_ms = (d.tokens_used - 999) / (10_000 / 60) * 1000
    assert abs(d.reset_ms - expected_ms) < 2500
    # An empty previous minute: the current one alone counts, as before.
    r.delete(previous)
    assert reserve(400, "b").admitted and reserve(600, "c").admitted
    d = reserve(1, "d")
    assert not d.admitted and d.tokens_used == 1000
