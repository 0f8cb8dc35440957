# What a worker tells admission about its speed (in its stats hash, read by the API's load
# shedding): tokens it processes per second of work (prompt and output tokens alike, the unit the
# queues' token counters count in; admission's fallback until the step prices are fitted,
# workers/gpu/step_prices.py) and the mean prompt and output lengths of the requests it finished:
# admission uses the output as the expected output of a request without a small max_tokens, and
# both to price the tokens queued in Redis and to size the mean request's KV.
#
# A second of work is a loop turn that ran a step, host work and the Redis round trip included
# (on a CPU worker the step alone is only ~60 % of the turn: counting steps only overstated the
# rate and let the queue grow past its bound). Turns with nothing to step are left out, so an idle
# worker keeps reporting the speed it had when it last worked instead of decaying to zero: the
# first burst after a quiet spell is not shed for a rate measured while nothing was asked. Under
# the sustained load where shedding matters, every turn steps and this is the wall-clock rate.
from __future__ import annotations

import math
from collections import deque

from service.admission import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS
from workers.gpu.output_lengths import OutputLengths

WINDOW_S = 1.0  # seconds of work per rate sample
ALPHA = 0.3  # weight of the newest rate sample
# The mean lengths are over the last FINISHED_WINDOW finished requests, not a moving average:
# the brief's traffic has a 2 % tail of 8k-30k-token documents and lognormal outputs, and one
# such request moved a 0.3-weighted mean by thousands of tokens, and the running set the
# seat rule sizes from it (workers/gpu/intake_budget.py) with it. A window of 64 still held
# 0-4 of those documents: on an H200 the 8B's mean uncached prompt swung 340-690 tokens within
# seconds, and its TPOT seats with it; 256 hold ~5 and move ~120 tokens for each.
FINISHED_WINDOW = 256
# Interactive demand, as a share of the seats the worker sustains (the running set the TPOT
# target and the KV pool allow): the interactive requests running or waiting in its engine over
# those seats, averaged over about SHARE_TAU_S. By Little's law the seats a class holds are its
# arrival rate times its time in service, so this is the share of the worker interactive work
# takes, whatever flex does with the rest; flex, which yields to it, gets only the remainder.
# Admission forecasts a flex request's wait with it (api/load_shedding.py): counting only the
# work ahead let the 8B on an H200 admit flex for a 30 s bound while interactive arrivals took
# every seat, and flex first tokens came after 53-89 s.
SHARE_TAU_S = 10.0
# The same share over about RECENT_TAU_S, for the seats batch intake leaves free for interactive
# arrivals (workers/gpu/intake_budget.py): the 10 s one kept a worker running flex one or two at
# a time for ten seconds after an interactive burst had ended.
RECENT_TAU_S = 2.0


class LoadReport:
    def __init__(self) -> None:
        self.tokens_per_s = 0.0
        self.mean_output_tokens = DEFAULT_OUTPUT_TOKENS
        self.mean_prompt_tokens = DEFAULT_PROMPT_TOKENS
        # ... of which not found in the prefix cache: the prefill a request really costs
        self.mean_uncached_prompt_tokens = DEFAULT_PROMPT_TOKENS
        self._tokens = 0
        self._busy_s = 0.0
        self._finished: deque[tuple[int, int, int]] = deque(maxlen=FINISHED_WINDOW)
        # the finished outputs' distribution, for a running request's remaining output
        self.output_lengths = OutputLengths(DEFAULT_OUTPUT_TOKENS)
        self.interactive_share = 0.0
        self.recent_interactive_share = 0.0
        self._share_at: float | None = None

    def on_step(self, num_tokens: int, busy_s: float) -> None:
        self._tokens += num_tokens
        self._busy_s += busy_s
        if self._busy_s >= WINDOW_S:
            rate = self._tokens / self._busy_s
            first = self.tokens_per_s == 0.0
            self.tokens_per_s = rate if first else ALPHA * rate + (1 - ALPHA) * self.tokens_per_s
            self._tokens, self._busy_s = 0, 0.0

    def on_finished(
        self, completion_tokens: int, prompt_tokens: int, cached_tokens: int = 0
    ) -> None:
        uncached = max(0, prompt_tokens - cached_tokens)
        self._finished.append((completion_tokens, prompt_tokens, uncached))
        self.output_lengths.add(completion_tokens)
        n = len(self._finished)
        self.mean_output_tokens = sum(f[0] for f in self._finished) / n
        self.mean_prompt_tokens = sum(f[1] for f in self._finished) / n
        self.mean_uncached_prompt_tokens = sum(f[2] for f in self._finished) / n

    def on_seats(self, interactive: int, seats: int, now: float) -> None:
        """`interactive` requests running or waiting in the engine, `seats` it sustains."""
        sample = min(1.0, interactive / max(1, seats))
        if self._share_at is None:
            self.interactive_share = self.recent_interactive_share = sample
        else:
            elapsed = max(0.0, now - self._share_at)
            weight = 1.0 - math.exp(-elapsed / SHARE_TAU_S)
            self.interactive_share += weight * (sample - self.interactive_share)
            weight = 1.0 - math.exp(-elapsed / RECENT_TAU_S)
            self.recent_interactive_share += weight * (sample - self.recent_interactive_share)
        self._share_at = now

    def fields(self) -> dict[str, str]:
        # Admission paces flex with the larger share: a burst slows flex at once, and only ~10 s
        # without one speeds it again (the 10 s share alone let flex in at the pace of before
        # while a burst took the seats).
        share = max(self.interactive_share, self.recent_interactive_share)
        return {
            "interactive_share": f"{share:.4f}",
            "tokens_per_s": f"{self.tokens_per_s:.1f}",
            "mean_output_tokens": f"{self.mean_output_tokens:.1f}",
            "mean_prompt_tokens": f"{self.mean_prompt_tokens:.1f}",
            "mean_uncached_prompt_tokens": f"{self.mean_uncached_prompt_tokens:.1f}",
        }
