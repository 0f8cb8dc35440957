# The stop-string matcher: the same answer as growing the text one character at a time, however
# the text is split, and time and memory linear in the stop strings' length (the case that took a
# worker to 5.8 GB: four stop strings of 100,000 characters).
from __future__ import annotations

import random
import tracemalloc

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.stop_matcher import StopMatcher
from engine.tokenizer import ByteTokenizer

pytestmark = pytest.mark.timeout(120)


def reference(text: str, stops: list[str]) -> tuple[int, str] | None:
    """(end, stop) of the first stop to complete; the longer one on a tie."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if s and text[:end].endswith(s)]
        if hits:
            return end, max(hits, key=len)
    return None


def partial(text: str, stops: list[str]) -> int:
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def feed_in_pieces(matcher: StopMatcher, text: str, rng: random.Random):
    fed = 0
    while fed < len(text):
        piece = text[fed : fed + rng.randint(1, 4)]
        hit = matcher.feed(piece)
        if hit is not None:
            return fed + hit[0], hit[1]
        fed += len(piece)
    return None


def test_random_texts_match_the_reference():
    rng = random.Random(18)
    for _ in range(3000):
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(3)]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 30)))
        assert feed_in_pieces(StopMatcher(stops), text, rng) == reference(text, stops), (
            text,
            stops,
        )
        clean = "".join(c for c in text if c != "a")  # often no hit: then the held suffix
        if reference(clean, stops) is None:
            matcher = StopMatcher(stops)
            matcher.feed(clean)
            assert matcher.partial_len == partial(clean, stops), (clean, stops)


def test_self_overlapping_stops_and_ties():
    assert StopMatcher(["aab"]).feed("aaab") == (4, "aab")  # the failure table: no restart
    assert StopMatcher(["abab"]).feed("ababab") == (4, "abab")
    assert StopMatcher(["b", "ab"]).feed("xab") == (3, "ab")  # a tie: the longer wins
    assert StopMatcher(["ab", "abc"]).feed("abc") == (2, "ab")  # first to complete wins
    assert StopMatcher(["", "x"]).feed("ax") == (2, "x")  # empty stops are ignored
    assert StopMatcher([]).feed("anything") is None


def test_four_stops_of_100_000_characters_cost_linear_memory():
    # Every prefix of these in a set was ~20 GB; the failure tables are ~3 MB.
    stops = [c * 99_999 + "!" for c in "abcd"]
    tracemalloc.start()
    try:
        matcher = StopMatcher(stops)
        # The worst text for a naive matcher: long runs that almost match, then break.
        for c in "ab":
            assert matcher.feed(c * 100_000 + "?") is None
        assert matcher.partial_len == 0
        assert matcher.feed("d" * 99_999 + "!") == (100_000, stops[3])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_detokenizer_with_long_stops_streams_and_holds_back_only_a_partial_match():
    byte_tok = ByteTokenizer()
    stop = "x" * 100_000
    detok = IncrementalDetokenizer(byte_tok, [], stop=[stop, "y" * 100_000, "STOP", "z" * 5])
    out = []
    text = "hello " + "x" * 50_000 + " there STOP never"
    for token in byte_tok.encode(text, add_special_tokens=False):
        out.append(detok.update([token]))
        if detok.finished:
            break
    assert "".join(out) == "hello " + "x" * 50_000 + " there "
    assert detok.stop_reason == "STOP"
