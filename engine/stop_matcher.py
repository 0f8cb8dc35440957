# Stop strings matched over streamed text in time and memory linear in their total length: one
# Knuth-Morris-Pratt automaton per stop string (its failure table is one int per character), fed
# each new character once. Holding every prefix of every stop string instead costs memory
# quadratic in their length (four stops of 100,000 characters: gigabytes) and a quadratic scan
# per step.
from __future__ import annotations

from array import array
from collections.abc import Sequence


def _failure_table(pattern: str) -> array:
    """fail[i]: the length of the longest proper prefix of pattern[: i + 1] that is also its
    suffix. O(len(pattern)) time, one machine int per character."""
    fail = array("l", [0]) * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = fail[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        fail[i] = k
    return fail


class StopMatcher:
    """Finds the first stop string to complete in text fed piece by piece.

    `partial_len` is the longest suffix of everything fed so far that is a prefix of some stop
    string: text that must be held back, as it may yet become a stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self._fail = [_failure_table(s) for s in self.stops]
        self._matched = [0] * len(self.stops)  # per stop: characters matched at the text's end

    @property
    def partial_len(self) -> int:
        return max(self._matched, default=0)

    def feed(self, text: str) -> tuple[int, str] | None:
        """Advances over `text`; returns (the index in `text` just past the first completed stop,
        that stop), or None. The stop that completes first wins, as if the text had arrived one
        character at a time; on a tie, the longer one. After a hit the matcher is spent."""
        if not self.stops:
            return None
        stops, fails, matched = self.stops, self._fail, self._matched
        for end, ch in enumerate(text, start=1):
            hit: str | None = None
            for j, stop in enumerate(stops):
                k, fail = matched[j], fails[j]
                while k and stop[k] != ch:
                    k = fail[k - 1]
                if stop[k] == ch:
                    k += 1
                if k == len(stop):
                    if hit is None or len(stop) > len(hit):
                        hit = stop
                    k = fail[k - 1]
                matched[j] = k
            if hit is not None:
                return end, hit
        return None
