# How much longer a running request will generate, from the outputs this worker finished lately:
# the seat schedule's expected end of each running request (workers/gpu/seat_schedule.py).
#
# The mean output is the wrong guess for a request already past it. The brief's outputs are
# lognormal (mean ~400, a tail to 2,048), and by the time a request has made 500 tokens it is
# one of the long ones: the schedule priced it at one more turn (the mean was passed), and with
# half the running set so priced, a 256-seat 8B on an H200 forecast seat waits of 0.4-0.8 s that
# took 2.7-3.1 s. Here a request that has made n tokens is expected to make
#
#     E[min(L, max_tokens) | L > n] - n
#
# over the last WINDOW finished outputs L (each finished request counted once, so the sample is
# not biased toward the long ones the way the running set is). Past every sample it is expected
# to run as long again as it has (capped by its max_tokens): a guess on the long side, which
# refuses an arrival too many rather than seating it late.
from __future__ import annotations

import bisect
import itertools
from collections import deque

WINDOW = 512  # finished outputs kept: a 2 % tail has ~10 samples in it


class OutputLengths:
    def __init__(self, default: int) -> None:
        self.default = max(1, default)  # the one sample until a request has finished
        self._window: deque[int] = deque(maxlen=WINDOW)
        self._sorted: list[int] = []
        self._prefix: list[int] = [0]  # _prefix[i] = sum(_sorted[:i])
        self._stale = False

    def add(self, completion_tokens: int) -> None:
        self._window.append(max(1, completion_tokens))
        self._stale = True

    def remaining(self, generated: int, max_tokens: int) -> int:
        """Expected tokens still to come from a request that has made `generated` of at most
        `max_tokens`; at least 1 (its next turn may be its last)."""
        left = max_tokens - generated
        if left <= 1:
            return 1
        lengths, prefix = self._table()
        above = bisect.bisect_right(lengths, generated)  # first sample longer than generated
        capped = bisect.bisect_right(lengths, max_tokens, lo=above)  # first one past max_tokens
        count = len(lengths) - above
        if count == 0:
            return max(1, min(left, generated))
        total = prefix[capped] - prefix[above] + max_tokens * (len(lengths) - capped)
        return max(1, min(left, round(total / count) - generated))

    def _table(self) -> tuple[list[int], list[int]]:
        if self._stale or not self._sorted:
            self._sorted = sorted(self._window) if self._window else [self.default]
            self._prefix = [0, *itertools.accumulate(self._sorted)]
            self._stale = False
        return self._sorted, self._prefix
