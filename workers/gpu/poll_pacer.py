# When the worker may poll the queues while a step runs on the GPU. A poll is a Redis round trip
# that blocks the loop's thread (≈ 0.5–1 ms); if the step ends during it, the GPU sits idle until
# the reply is in — measured on an H200 at 7 req/s, that late finish was a third of the served
# worker's GPU idle time per decode step. So a poll is sent only when the step is expected to
# run longer than the poll takes, with a margin: the step's expected length comes from recent
# steps of the same kind (decode-only or carrying prompt tokens), the poll's from recent polls.
# Between polls the loop checks the step's completion event every SPIN_S.
from __future__ import annotations

import time

SPIN_S = 0.00005  # the sleep between completion checks (Linux rounds it up to ≈ 0.1 ms)
SMOOTHING = 0.5  # weight of the newest observation: consecutive steps are alike
POLL_MARGIN = 2.0  # a poll needs this many poll lengths of expected step time left


class PollPacer:
    def __init__(self) -> None:
        self.step_s = {True: 0.0, False: 0.0}  # decode-only? → expected launch-to-done seconds
        self.poll_s = 0.001  # expected length of one poll (a guess until measured)
        self._decode_only = True
        self._launched_at = 0.0

    def launched(self, decode_only: bool) -> None:
        self._decode_only = decode_only
        self._launched_at = time.perf_counter()

    def done(self) -> None:
        """The step was seen finished (or finish_step returned)."""
        elapsed = time.perf_counter() - self._launched_at
        prev = self.step_s[self._decode_only]
        self.step_s[self._decode_only] = (
            elapsed if prev == 0.0 else SMOOTHING * elapsed + (1 - SMOOTHING) * prev
        )

    def polled(self, seconds: float) -> None:
        self.poll_s = SMOOTHING * seconds + (1 - SMOOTHING) * self.poll_s

    def may_poll(self) -> bool:
        """Whether a poll sent now is expected to return before the step ends. The first step
        of a kind (nothing measured yet) may poll."""
        expected = self.step_s[self._decode_only]
        if expected == 0.0:
            return True
        left = self._launched_at + expected - time.perf_counter()
        return left > POLL_MARGIN * self.poll_s
