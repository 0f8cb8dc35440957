# When this worker's seats free up, for admission's forecast of an interactive request's wait
# (api/load_shedding.py). A request that finds every seat taken waits for the running requests to
# finish; the mean rate at which they do (the work model) is right on average but not for the
# request that arrives after a burst: requests admitted together finish together, and then no
# seat frees for a while. On an H200 the 8B at 256 seats had first tokens waiting 1.75-1.84 s for
# a seat against forecasts of 0.40-0.70 s (docs/benchmarks.md#overload-issue-36).
#
# The worker knows its running set: each interactive request's expected remaining output (by the
# outputs the worker finished lately, given what it has made so far and its max_tokens:
# workers/gpu/output_lengths.py) at the turn time the step prices predict for the running set
# (its decodes plus its share of the prompts the turns carry). Batch requests are left out: an
# interactive arrival takes a running batch request's seat at once (the scheduler preempts it),
# so those seats count as free already.
#
#   finish_s  the predicted seconds until each running interactive request ends, ascending,
#             the first MAX_PUBLISHED of them
#   over      interactive requests the engine holds beyond the seats the TPOT target allows
#             (waiting ones and any excess), less the batch seats they may take: negative when
#             seats are free now
#
# An interactive request with n more ahead of it in Redis gets its seat when the
# (over + n + 1)-th of these ends.
from __future__ import annotations

from dataclasses import dataclass

from engine import LLMEngine
from engine.core.request import Priority
from workers.gpu.output_lengths import OutputLengths

MAX_PUBLISHED = 64  # finish times published (a request further back is priced by the work model)


@dataclass(frozen=True, slots=True)
class SeatSchedule:
    finish_s: tuple[float, ...]
    over: int

    def fields(self) -> dict[str, str]:
        return {
            "seat_finish_s": ",".join(f"{s:.3f}" for s in self.finish_s),
            "seat_over": str(self.over),
        }


def seat_schedule(
    engine: LLMEngine, max_running: int, turn_s: float, outputs: OutputLengths
) -> SeatSchedule:
    """turn_s: the predicted turn of the running set; outputs: the finished outputs."""
    scheduler = engine.scheduler
    turns: list[int] = []
    held = 0  # requests interactive work cannot take the seat of
    for r in scheduler.running:
        if r.priority is not Priority.INTERACTIVE:
            continue
        held += 1
        prefill = 1 if r.num_tokens - r.num_computed_tokens > 1 else 0  # its last chunk's turn
        turns.append(prefill + outputs.remaining(r.num_output_tokens, r.max_tokens))
    turns.sort()
    waiting = len(scheduler.waiting[Priority.INTERACTIVE])
    return SeatSchedule(
        finish_s=tuple(n * turn_s for n in turns[:MAX_PUBLISHED]),
        over=held + waiting - max_running,
    )
