import pytest

from engine.core.kv_cache import profile_lengths


@pytest.mark.parametrize(
    ("budget", "max_seqs", "max_len"),
    [
        (8192, 256, 544),
        (8192, 256, 131072),
        (8192, 4, 1000),
        (100, 256, 7),
        (5, 1, 3),
        (8192, 1, 8192),
    ],
)
def test_profile_step_respects_every_limit(budget, max_seqs, max_len):
    lens = profile_lengths(budget, max_seqs, max_len)
    assert sum(lens) == min(budget, max_seqs * max_len)  # the worst step's token count
    assert len(lens) <= max_seqs
    assert max(lens) <= max_len
    assert max(lens) - min(lens) <= 1  # spread evenly
