# The token-count buckets of the mixed steps' graph pieces (engine/runner/piecewise_graphs.py):
# powers of two by default; with a step, powers of two up to it and then every multiple of it,
# always ending at max_tokens, so a step pads to the next bucket and never past the largest.
import itertools

import pytest

from engine.config import EngineConfig
from engine.runner.piecewise_graphs import bucket_ladder


def test_step_zero_gives_powers_of_two():
    assert bucket_ladder(2048) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert bucket_ladder(1000) == [16, 32, 64, 128, 256, 512, 1000]
    assert bucket_ladder(8) == [8]


def test_a_step_ladder_bounds_the_padding():
    ladder = bucket_ladder(2304, step=128)
    assert ladder[:4] == [16, 32, 64, 128]
    assert ladder[4:] == [*range(256, 2304, 128), 2304]
    for n in range(129, 2305):  # past the first step, a step pads by less than the step
        assert 0 <= next(b for b in ladder if b >= n) - n < 128
    assert bucket_ladder(48, step=16) == [16, 32, 48]


def test_bad_steps_are_refused():
    for step in (-1, 96):
        with pytest.raises(ValueError):
            bucket_ladder(2048, step)
        with pytest.raises(ValueError):
            EngineConfig(model="tiny", device="cpu", piecewise_bucket_step=step)
    assert EngineConfig(model="tiny", device="cpu", piecewise_bucket_step=256)


def test_the_default_ladder_keeps_a_long_slice_beside_decodes_in_graphs():
    config = EngineConfig(model="tiny", device="cpu")
    ladder = bucket_ladder(config.piecewise_max_tokens, config.piecewise_bucket_step)
    # A long prompt's slice (long_prefill_chunk) beside a full batch of decodes fits the ladder.
    assert ladder[-1] >= config.long_prefill_chunk + config.max_num_seqs
    assert max(b - a for a, b in itertools.pairwise(ladder)) <= config.piecewise_bucket_step
