# When a worker's seats free up (workers/gpu/seat_schedule.py): each running interactive
# request's expected remaining turns at the running set's predicted turn; batch requests hold no
# seat an interactive arrival cannot take. A real engine (tiny preset, CPU) and step prices fit
# on a synthetic machine's turns.
from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.workers.test_intake_budget import engine, fitted_prices, report, run, settings
from workers.gpu.intake_budget import intake_budget
from workers.gpu.output_lengths import OutputLengths
from workers.gpu.seat_schedule import MAX_PUBLISHED, seat_schedule


def test_the_oldest_running_requests_free_their_seats_first():
    eng = engine()
    run(eng, 2, prefix="old")  # max_tokens 32, prompts prefilled by this step
    for _ in range(9):
        eng.step()
    run(eng, 2, prefix="new")
    run(eng, 1, "batch", prefix="b")
    eng.add_request("w", list(range(1, 17)), SamplingParams(max_tokens=32, ignore_eos=True))
    budget = intake_budget(eng, fitted_prices(), report(output=32), settings(tpot_target_s=0.04))
    seats = budget.seats_free
    assert budget.max_running == 5 and seats is not None
    # Four interactive running and one waiting against five seats; the batch one is not counted.
    assert seats.over == 4 + 1 - 5
    assert len(seats.finish_s) == 4 and list(seats.finish_s) == sorted(seats.finish_s)
    old = {r.num_output_tokens for r in eng.scheduler.running if r.request_id.startswith("old")}
    new = {r.num_output_tokens for r in eng.scheduler.running if r.request_id.startswith("new")}
    assert min(old) > max(new)  # the old ones are further along ...
    turn = seats.finish_s[0] / (32 - max(old))
    assert turn > 0  # ... and end first, after their remaining turns at one turn each
    assert seats.finish_s[2] == pytest.approx((32 - max(new)) * turn)
    fields = budget.fields()
    assert fields["seat_over"] == "0" and len(fields["seat_finish_s"].split(",")) == 4


def test_a_request_past_the_mean_output_is_priced_by_the_longer_outputs():
    eng = engine()
    run(eng, 1)  # max_tokens 32
    for _ in range(20):
        eng.step()
    (r,) = eng.scheduler.running
    made = r.num_output_tokens
    assert made > 8
    # Finished outputs of 8 and 28 tokens: past 8 only the 28 is left, so 28 - made more turns
    # (not one more, as when the mean of 18 was all the schedule knew).
    outputs = OutputLengths(default=8)
    for n in (8, 28):
        outputs.add(n)
    (end,) = seat_schedule(eng, max_running=4, turn_s=0.05, outputs=outputs).finish_s
    assert end == pytest.approx((28 - made) * 0.05)
    # Past every output seen: as long again as it has run, capped by its max_tokens (32).
    outputs = OutputLengths(default=8)
    outputs.add(8)
    (end,) = seat_schedule(eng, max_running=4, turn_s=0.05, outputs=outputs).finish_s
    assert end == pytest.approx((32 - made) * 0.05)
    # Published: at most MAX_PUBLISHED ends.
    assert MAX_PUBLISHED >= 32
