# N-gram (prompt lookup) proposer: match the last n tokens of a request's prompt + output
# against earlier text and propose what followed the most recent earlier match. No model, no
# KV: it runs on the host before scheduling, so the scheduler reserves exactly the slots the
# drafts need. Longer matches are tried first (ngram_max down to ngram_min).
#
# Each request keeps an NgramIndex (n-gram → start of its latest occurrence that has a
# continuation), extended by the tokens appended since the last step, so a proposal is a few
# dict lookups instead of a scan of the whole text (a scan costs ~100 µs per request per step
# at a few hundred tokens: milliseconds per step at batch 64). token_ids only grow while a
# request runs (drafts are never appended unverified), so the index never needs undoing.
# propose_ngram is the scanning definition the index must agree with (tests compare them).
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine.core.request import Request


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


class NgramIndex:
    __slots__ = ("num_indexed", "tables")

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        # tables[n][tuple(tokens[s : s + n])] = the largest such s with s + n < num_indexed
        self.tables: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(ngram_max, ngram_min - 1, -1)
        }
        self.num_indexed = 0

    def update(self, tokens: list[int]) -> None:
        """Register every n-gram whose continuation token arrived since the last update."""
        num_tokens = len(tokens)
        for n, table in self.tables.items():
            for end in range(max(self.num_indexed, n), num_tokens):  # end: the continuation
                table[tuple(tokens[end - n : end])] = end - n
        self.num_indexed = num_tokens

    def propose(self, tokens: list[int], k: int) -> list[int]:
        num_tokens = len(tokens)
        for n, table in self.tables.items():  # longest first
            if n >= num_tokens:
                continue
            start = table.get(tuple(tokens[num_tokens - n :]))
            if start is not None:
                return tokens[start + n : start + n + k]
        return []


class NgramProposer:
    needs_slots_first = False  # proposes before scheduling

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def plan(self, requests: list[Request]) -> None:
        """Fill spec_token_ids (at most spec_slots each) and shrink spec_slots to match."""
        for r in requests:
            index = r.ngram_index
            if index is None:
                index = r.ngram_index = NgramIndex(self.ngram_min, self.ngram_max)
            index.update(r.token_ids)
            drafts = index.propose(r.token_ids, r.spec_slots)
            r.spec_token_ids = drafts
            r.spec_slots = len(drafts)

    def propose(self, requests: list[Request]) -> None:
        pass  # already proposed in plan()
