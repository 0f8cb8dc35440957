# find_prefix_groups: which decode rows share their leading cache blocks, from block tables.
import time

import numpy as np
import pytest

from engine.core.prefix_groups import find_prefix_groups

BS = 16


def _tables(prefixes, own_blocks, rng):
    """Rows made of a shared prefix (a list of block ids) then blocks of their own; returns
    (tables padded with -1, seq_lens: all blocks full plus one key in a last block)."""
    next_id = 10_000
    rows = []
    for prefix, n in zip(prefixes, own_blocks):
        rows.append(list(prefix) + list(range(next_id, next_id + n + 1)))
        next_id += n + 1
    width = max(len(r) for r in rows)
    tables = np.full((len(rows), width), -1, dtype=np.int32)
    for i, r in enumerate(rows):
        tables[i, : len(r)] = r
    seq_lens = np.array([(len(r) - 1) * BS + 1 for r in rows])
    return tables, seq_lens


def _find(tables, seq_lens, **kw):
    args = {"min_blocks": 2, "max_blocks": 64, "max_groups": 4, "max_rows": 4} | kw
    return find_prefix_groups(tables, seq_lens, BS, **args)


def _groups(result):
    return sorted(
        (sorted(r[r >= 0].tolist()), int(n)) for r, n in zip(result.rows, result.prefix_lens) if n
    )


def test_rows_sharing_leading_blocks_form_groups():
    rng = np.random.default_rng(0)
    a, b = [1, 2, 3, 4], [7, 8, 9]
    tables, seq_lens = _tables([a, b, a, [5], b, a], [3, 2, 1, 4, 0, 2], rng)
    result = _find(tables, seq_lens)
    assert _groups(result) == [([0, 2, 5], 4 * BS), ([1, 4], 3 * BS)]
    assert result.key_start.tolist() == [64, 48, 64, 0, 48, 64]
    assert result.rows.shape == (4, 4) and result.num_grouped_rows == 5
    assert result.shared_keys_saved == 2 * 64 + 1 * 48


def test_a_common_template_block_alone_is_not_a_group():
    # every prompt starts with the same block (a chat template), then differs
    tables, seq_lens = _tables([[1, 2, 3], [1, 5, 6], [1, 2, 3], [1, 8, 9]], [2, 2, 2, 2], None)
    assert _groups(_find(tables, seq_lens)) == [([0, 2], 3 * BS)]


def test_group_prefix_is_the_smallest_common_length_and_stops_before_the_last_key():
    # row 1 diverges after 3 blocks; row 2's context ends inside the prefix's 4th block, so
    # only its 3 full blocks before its last key count
    tables, seq_lens = _tables([[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 4, 5]], [1, 1, 1], None)
    seq_lens[2] = 3 * BS + 5
    assert _groups(_find(tables, seq_lens)) == [([0, 1, 2], 3 * BS)]


def test_entries_past_a_row_are_never_matched():
    # two short rows whose tables hold the same garbage past their lengths
    tables = np.array([[1, 2, 0, 0, 0], [3, 4, 0, 0, 0]], dtype=np.int32)
    assert _groups(_find(tables, np.array([33, 33]))) == []


def test_caps_groups_rows_and_prefix_blocks():
    a, b, c = list(range(1, 9)), list(range(20, 23)), list(range(30, 32))
    # a: 6 rows -> chunks of 4 and 2; b: 2 rows; c: 2 rows (least saving, dropped by max_groups)
    prefixes = [a] * 6 + [b] * 2 + [c] * 2
    tables, seq_lens = _tables(prefixes, [1] * 10, None)
    result = _find(tables, seq_lens, max_groups=3, max_blocks=5)
    groups = _groups(result)
    assert groups == [([0, 1, 2, 3], 5 * BS), ([4, 5], 5 * BS), ([6, 7], 3 * BS)]
    assert result.key_start[8:].tolist() == [0, 0]


def test_no_candidates_and_bad_arguments():
    tables, seq_lens = _tables([[1], [1]], [0, 0], None)
    result = _find(tables, seq_lens)
    assert _groups(result) == [] and result.key_start.tolist() == [0, 0]
    with pytest.raises(ValueError):
        _find(tables, seq_lens, max_rows=1)


def test_cost_of_a_large_batch_stays_small():
    # 256 rows of ~2k keys, 8 prefixes of 75 blocks: a few hundred microseconds at most even
    # on a loaded CPU (the bound is generous; the old attempt took 110-170 us on a GPU host)
    rng = np.random.default_rng(1)
    prefixes = [list(range(p * 100, p * 100 + 75)) for p in range(8)]
    choice = rng.integers(0, 10, size=256)  # 8 of 10: shared, else no prefix
    rows = [prefixes[c] if c < 8 else [] for c in choice]
    tables, seq_lens = _tables(rows, rng.integers(40, 60, size=256).tolist(), rng)
    kw = {"min_blocks": 16, "max_blocks": 128, "max_groups": 32, "max_rows": 16}
    result = find_prefix_groups(tables, seq_lens, BS, **kw)
    assert result.num_grouped_rows >= 200
    best = min(_timed(lambda: find_prefix_groups(tables, seq_lens, BS, **kw)) for _ in range(5))
    assert best < 0.05  # seconds; a loaded shared CPU, not a benchmark


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.hf_models import build_hf_model

    directory = tmp_path_factory.mktemp("shared-prefix")
    build_hf_model(directory, "llama", seed=5)
    return directory


def shared_prompts() -> list[list[int]]:
    """Five prompts that open with one 70-token system prompt (4 whole 16-key blocks)."""
    rng = np.random.default_rng(3)
    system = rng.integers(2, 500, 70).tolist()
    return [system + rng.integers(2, 500, n).tolist() for n in (5, 9, 17, 30, 3)]


def test_engine_groups_decode_rows_of_a_cached_system_prompt(model_dir):
    # A real engine (CPU: attention runs the torch reference, the groups ride along unused):
    # once the system prompt is cached, the decode steps of the prompts that reuse it carry
    # one group of them, and the text is the flag-off engine's.
    from engine import LLM, SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = shared_prompts()
    opts = {"device": "cpu", "dtype": "float32", "num_kv_blocks": 128}
    plain = LLM(str(model_dir), **opts).generate(prompts, greedy)
    llm = LLM(str(model_dir), shared_prefix_decode=True, shared_prefix_min_tokens=32, **opts)
    builder = llm.engine.runner.batch_builder
    seen = []
    to_device = builder.to_device

    def spy(packed):
        batch = to_device(packed)
        if batch.meta.decode_prefix_groups is not None:
            seen.append(batch.meta.decode_prefix_groups.prefix_lens.tolist())
        return batch

    builder.to_device = spy
    llm.generate(prompts[:1], greedy)  # caches the system prompt's blocks
    shared = llm.generate(prompts, greedy)
    assert [o.token_ids for o in shared] == [o.token_ids for o in plain]
    assert seen and all(lens == [64] for lens in seen)  # 4 whole blocks of 16
