# N-gram (prompt lookup) proposer: match the last n tokens of a request's prompt + output
# against earlier text and propose what followed the most recent earlier match. No model, no
# KV: it runs on the host before scheduling, so the scheduler reserves exactly the slots the
# drafts need. Longer matches are tried first (ngram_max down to ngram_min).
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.request import Request


def propose_ngram(tokens: np.ndarray, ngram_min: int, ngram_max: int, k: int) -> list[int]:
    """tokens: [num_tokens] int64. Up to k tokens that followed the most recent earlier
    occurrence of the longest matching suffix; [] when nothing matches."""
    num_tokens = tokens.shape[0]
    for n in range(min(ngram_max, num_tokens - 1), ngram_min - 1, -1):
        suffix = tokens[num_tokens - n :]
        # windows[i] = tokens[i : i + n] for every start i < num_tokens - n (earlier matches;
        # the suffix itself is excluded, so a continuation of at least one token exists).
        windows = sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer:
    needs_slots_first = False  # proposes before scheduling

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def plan(self, requests: list[Request]) -> None:
        """Fill spec_token_ids (at most spec_slots each) and shrink spec_slots to match."""
        for r in requests:
            tokens = np.asarray(r.token_ids, dtype=np.int64)
            drafts = propose_ngram(tokens, self.ngram_min, self.ngram_max, r.spec_slots)
            r.spec_token_ids = drafts
            r.spec_slots = len(drafts)

    def propose(self, requests: list[Request]) -> None:
        pass  # already proposed in plan()
