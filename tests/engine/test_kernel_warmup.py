# Start-up warm-up of the mixed-step kernel variants (engine/runner/kernel_warmup.py): the synthetic
# steps reach every chunk-length tier with and without a cached prefix and every decode split
# count, are packed as real steps are, and running them (both forward paths) writes nothing to
# the KV pool and changes no later output. On the CPU the kernels are the torch twins; the GPU
# test (tests/engine/test_gpu_paths.py) checks that no kernel compiles after the warm-up.
import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.runner.kernel_warmup import (
    CACHED_PREFIX,
    CHUNK_LENS,
    DECODE_CONTEXT,
    DECODE_SPLITS,
    WarmupStep,
    pack,
    warm_up_mixed_steps,
    warmup_steps,
)
from tests.engine.counting_pieces import attach_counting_pieces
from tests.hf_models import VOCAB, build_hf_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("warmup")
    build_hf_model(directory, "llama", seed=5)
    return directory


def test_steps_reach_every_chunk_tier_and_split_count():
    steps = warmup_steps(max_tokens=4096, max_model_len=8192)
    chunks = {c for s in steps for c in s.chunks}
    for q in CHUNK_LENS:
        assert (q, 0) in chunks and (q, CACHED_PREFIX) in chunks
    assert {s.decode_splits for s in steps if s.num_decodes} == set(DECODE_SPLITS)
    assert any(s.num_decodes == 0 for s in steps)  # prompts alone too


def test_steps_respect_the_token_budget_and_context():
    steps = warmup_steps(max_tokens=40, max_model_len=50)
    assert steps and all(s.num_tokens <= 40 for s in steps)
    assert all(q + p <= 50 for s in steps for q, p in s.chunks)
    assert max(q for s in steps for q, _ in s.chunks) < 40


def test_pack_lays_a_step_out_as_the_batch_builder_does(model_dir):
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=64)
    runner = llm.engine.runner
    step = next(s for s in warmup_steps(4096, 4096) if s.chunks == ((9, CACHED_PREFIX),))
    batch = runner.batch_builder.to_device(pack(step, runner.block_size, 64, 4096))
    meta, nd = batch.meta, step.num_decodes
    lens = [DECODE_CONTEXT] * nd + [CACHED_PREFIX + 9]
    assert meta.seq_lens.tolist() == lens and meta.num_decodes == nd
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 12]
    assert meta.prefill_query_start_loc.tolist() == [0, 9]
    assert meta.max_query_len == 9 and meta.decode_num_splits == step.decode_splits
    assert meta.decode_order.tolist() == list(range(nd))
    assert batch.input_ids.shape[0] == nd + 9
    assert (meta.slot_mapping == -1).all()  # nothing stored
    expected_positions = [DECODE_CONTEXT - 1] * nd + list(range(CACHED_PREFIX, CACHED_PREFIX + 9))
    assert batch.positions.tolist() == expected_positions
    assert batch.logits_indices.tolist() == [0, 1, 2, 11]  # each sequence's last token
    blocks = -(-DECODE_CONTEXT // runner.block_size)
    assert tuple(meta.block_tables.shape) == (nd + 1, blocks)
    assert int(meta.block_tables.max()) < 64


def test_pack_clamps_block_ids_and_context_to_a_small_pool(model_dir):
    step = warmup_steps(4096, 4096)[0]
    packed = pack(step, block_size=8, num_blocks=4, max_model_len=40)
    seq_lens = packed.i32[: packed.num_seqs].tolist()
    assert max(seq_lens[: step.num_decodes]) == 40
    assert packed.max_blocks == 5
    end = packed.i32.shape[0] - packed.num_decodes  # the decode order follows the tables
    tables = packed.i32[end - packed.num_seqs * packed.max_blocks : end]
    tables = tables.reshape(packed.num_seqs, -1)
    assert tables[0].tolist() == [0, 1, 2, 3, 3]  # clamped to the pool's last block


def test_a_timed_steps_rows_read_blocks_of_their_own_across_the_pool():
    # The calibration's steps (engine/runner/step_calibration.py): rows sharing blocks read the
    # keys from L2 and priced attention at half its served cost on an H100.
    step = WarmupStep(4, None, ((8, 16),))
    packed = pack(step, block_size=8, num_blocks=12, max_model_len=64, decode_context=24,
                  distinct_tables=True)  # fmt: skip
    end = packed.i32.shape[0] - packed.num_decodes
    tables = packed.i32[end - packed.num_seqs * packed.max_blocks : end].reshape(5, -1)
    assert tables.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [0, 1, 2]]


def test_warm_up_writes_no_kv_and_changes_no_output(model_dir):
    rng = random.Random(3)
    system = [rng.randrange(2, VOCAB) for _ in range(70)]
    prompts = [system + [rng.randrange(2, VOCAB) for _ in range(n)] for n in (1, 9, 40)]
    prompts.append([rng.randrange(2, VOCAB) for _ in range(100)])
    options = dict(dtype="float32", device="cpu", num_kv_blocks=128, max_num_batched_tokens=64)
    expected = [o.token_ids for o in LLM(str(model_dir), **options).generate(prompts, GREEDY)]

    llm = LLM(str(model_dir), **options)
    runner = llm.engine.runner
    # The graph pieces, run eagerly through their static buffers on the CPU: both paths.
    runs = attach_counting_pieces(runner, max_tokens=64, bucket_step=16)
    runner.kv_caches.normal_()  # not zeros: a stray write would show
    before = runner.kv_caches.clone()
    report = warm_up_mixed_steps(runner)
    assert torch.equal(runner.kv_caches, before)
    steps = warmup_steps(64, runner.max_model_len)
    assert report["steps"] == len(steps) > 10
    assert len(runs) == len(steps)  # every step also went through the pieces
    assert report["compiles"] == 0  # the CPU runs the torch twins: nothing compiles
    runs.clear()
    got = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == expected
    assert runs  # the engine's own mixed steps used the pieces afterwards


def test_a_compile_during_serving_is_counted_in_the_step_and_the_stats(model_dir):
    # The CPU never compiles, so Triton's two hooks are called as its compiler calls them, between
    # two steps: the next step's trace row and the engine's total must show it.
    from types import SimpleNamespace

    from triton import knobs

    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=64)
    engine = llm.engine
    trace = engine.enable_step_trace(capacity=64)
    engine.add_request("a", list(range(2, 40)), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert engine.stats().kernel_compiles == 0
    kernel = SimpleNamespace(name="_dense_prefill_kernel")
    knobs.runtime.jit_cache_hook(fn=kernel)
    knobs.runtime.jit_post_compile_hook(fn=kernel)
    while engine.has_unfinished():
        engine.step()
    compiles = trace.columns()["kernel_compiles"].tolist()
    assert compiles[0] == 0 and compiles[1] == 1 and sum(compiles) == 1
    assert engine.stats().kernel_compiles == 1


def test_warm_up_runs_the_draft_model_too_and_writes_none_of_its_cache(model_dir):
    options = dict(dtype="float32", device="cpu", num_kv_blocks=128, max_num_batched_tokens=64)
    llm = LLM(str(model_dir), speculative_method="draft", draft_model=str(model_dir), **options)
    runner = llm.engine.runner
    draft = runner.draft
    seen: list[int] = []
    forward = draft.forward
    draft.forward = lambda ids, pos, meta: seen.append(ids.shape[0]) or forward(ids, pos, meta)
    draft.kv_caches.normal_()
    before = draft.kv_caches.clone()
    report = warm_up_mixed_steps(runner)
    steps = warmup_steps(64, runner.max_model_len)
    assert report["steps"] == len(steps)
    assert seen == [s.num_tokens for s in steps]  # every step, whole, through the draft
    assert torch.equal(draft.kv_caches, before)


def test_shared_prefix_steps_pack_one_group_at_every_split_count(model_dir):
    plain = warmup_steps(4096, 4096)
    steps = warmup_steps(4096, 4096, shared_prefix=True)
    shared = [s for s in steps if s.prefix_splits]
    assert not any(s.prefix_splits for s in plain) and len(steps) == len(plain) + len(shared)
    assert {s.prefix_splits for s in shared} == set(DECODE_SPLITS)
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=64,
              shared_prefix_decode=True, shared_prefix_min_tokens=32)  # fmt: skip
    runner = llm.engine.runner
    batch = runner.batch_builder.to_device(pack(shared[2], runner.block_size, 64, 4096, 16))
    meta, nd = batch.meta, shared[2].num_decodes
    groups = meta.decode_prefix_groups
    prefix = (DECODE_CONTEXT - 1) // runner.block_size * runner.block_size
    assert groups.rows.tolist() == [list(range(nd)) + [-1] * (16 - nd)]
    assert groups.prefix_lens.tolist() == [prefix] and groups.key_start.tolist() == [prefix] * nd
    assert meta.decode_prefix_splits == shared[2].prefix_splits
    assert meta.decode_order.tolist() == list(range(nd))  # the layout before is intact
    report = warm_up_mixed_steps(runner)
    assert report["steps"] == len(warmup_steps(4096, runner.max_model_len, shared_prefix=True))


def test_with_prefill_splits_every_tile_height_and_split_count_goes_through_the_split_kernel(
    model_dir,
):
    plain = warmup_steps(4096, 4096)
    steps = warmup_steps(4096, 4096, prefill_split=True)
    split = [s for s in steps if s.prefill_splits > 1]
    assert len(steps) == len(plain) + len(split) and not any(s.prefill_splits > 1 for s in plain)
    assert {s.chunks[0][0] for s in split} == set(CHUNK_LENS)  # every tile height
    assert {s.prefill_splits for s in split} == set(DECODE_SPLITS[1:])  # every reduce width
    llm = LLM(str(model_dir), dtype="float32", device="cpu", num_kv_blocks=64)
    runner = llm.engine.runner
    batch = runner.batch_builder.to_device(pack(split[-1], runner.block_size, 64, 4096))
    assert batch.meta.prefill_num_splits == split[-1].prefill_splits == DECODE_SPLITS[-1]
