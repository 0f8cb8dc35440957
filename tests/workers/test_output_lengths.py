# A running request's expected remaining output from the worker's finished outputs
# (workers/gpu/output_lengths.py): the mean of the longer ones, capped by its max_tokens.
from __future__ import annotations

import random

import pytest

from workers.gpu.output_lengths import WINDOW, OutputLengths


def lengths(*values: int, default: int = 100) -> OutputLengths:
    out = OutputLengths(default)
    for v in values:
        out.add(v)
    return out


def test_a_fresh_request_expects_the_mean_output():
    assert lengths(100, 200, 300).remaining(0, 10_000) == 200


def test_a_request_past_the_short_outputs_expects_the_mean_of_the_longer_ones_less_its_own():
    out = lengths(100, 200, 300, 1000)
    assert out.remaining(150, 10_000) == (200 + 300 + 1000) // 3 - 150
    assert out.remaining(500, 10_000) == 500  # only the 1,000 is longer
    # An output equal to what it made already ended there: not a longer one.
    assert out.remaining(300, 10_000) == 700


def test_max_tokens_caps_the_longer_outputs_and_the_remainder():
    out = lengths(100, 200, 300, 1000)
    assert out.remaining(150, 400) == (200 + 300 + 400) // 3 - 150
    assert out.remaining(390, 400) == 10
    assert out.remaining(399, 400) == 1  # its next turn is its last
    assert out.remaining(400, 400) == 1


def test_past_every_output_seen_it_runs_as_long_again_as_it_has():
    out = lengths(100, 200)
    assert out.remaining(250, 10_000) == 250
    assert out.remaining(250, 300) == 50


def test_before_any_request_finished_the_default_is_the_one_sample():
    out = OutputLengths(default=400)
    assert out.remaining(0, 10_000) == 400
    assert out.remaining(100, 10_000) == 300
    assert out.remaining(100, 250) == 150


def test_only_the_last_window_outputs_count():
    out = lengths(*([5000] * WINDOW))
    assert out.remaining(0, 100_000) == 5000
    for _ in range(WINDOW):
        out.add(50)
    assert out.remaining(0, 100_000) == 50


def test_the_bisection_matches_the_definition_on_a_lognormal_sample():
    rng = random.Random(3)
    sample = [max(1, int(rng.lognormvariate(5.6, 0.8))) for _ in range(WINDOW)]
    out = lengths(*sample)
    for made, cap in [(0, 2048), (50, 2048), (400, 2048), (900, 1000), (300, 350)]:
        longer = [min(v, cap) for v in sample if v > made]
        want = max(1, min(cap - made, round(sum(longer) / len(longer)) - made))
        assert out.remaining(made, cap) == pytest.approx(want, abs=0)
