# Greedy parity with HF transformers: random-weight models of every supported family, loaded
# from the same checkpoint directory by HF and by us, must produce identical token ids — also
# with prefix-cache hits, chunked prefill, preemption and mixed priorities in play.
import random

import pytest

from engine import LLM, SamplingParams
from tests.hf_models import FAMILIES, VOCAB, build_hf_model, hf_greedy

NEW_TOKENS = 20
LENGTHS = [1, 2, 5, 15, 16, 17, 31, 32, 33, 64, 100, 129, 180, 250, 301, 333]


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, VOCAB) for _ in range(n)] for n in LENGTHS]


def _shared_prefix_prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(2, VOCAB) for _ in range(70)]
    return [system + [rng.randrange(2, VOCAB) for _ in range(n)] for n in (1, 9, 16, 40, 75, 3)]


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_case(request, tmp_path_factory):
    family = request.param
    directory = tmp_path_factory.mktemp(f"hf-{family}")
    model = build_hf_model(directory, family)
    prompts = _prompts(1) + _shared_prefix_prompts(2)
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    return directory, prompts, expected


def _run(directory, prompts, **options):
    llm = LLM(str(directory), dtype="float32", device="cpu", **options)
    return llm, llm.generate(prompts, GREEDY)


def _assert_same(outputs, expected):
    for i, (out, want) in enumerate(zip(outputs, expected)):
        assert out.finish_reason == "length", (i, out.error)
        assert out.token_ids == want, f"prompt {i}: {out.token_ids} != {want}"


def test_greedy_parity(family_case):
    directory, prompts, expected = family_case
    _, outputs = _run(directory, prompts, num_kv_blocks=512, enable_prefix_caching=False)
    _assert_same(outputs, expected)
    assert all(o.num_cached_tokens == 0 for o in outputs)


def test_prefix_cache_hits_keep_outputs(family_case):
    directory, prompts, expected = family_case
    llm, first = _run(directory, prompts, num_kv_blocks=512)
    _assert_same(first, expected)
    again = llm.generate(prompts, GREEDY)
    _assert_same(again, expected)
    # The last prompt token is always recomputed, so a fully cached prompt hits all whole
    # blocks before it.
    assert all(o.num_cached_tokens == (len(p) - 1) // 16 * 16 for o, p in zip(again, prompts))
    assert sum(o.num_cached_tokens for o in again) > 0


def test_chunked_prefill_keeps_outputs(family_case):
    directory, prompts, expected = family_case
    _, outputs = _run(directory, prompts, num_kv_blocks=512, max_num_batched_tokens=24)
    _assert_same(outputs, expected)


def test_preemption_keeps_outputs(family_case):
    directory, prompts, expected = family_case
    # 30 blocks × 16 = 480 token slots: the longest request (353 tokens) fits alone, the whole
    # set (≈ 2,500 tokens) does not, so requests are preempted and recomputed.
    llm, outputs = _run(directory, prompts, num_kv_blocks=30)
    _assert_same(outputs, expected)
    assert sum(o.num_preemptions for o in outputs) > 0
    assert llm.engine.stats().num_free_blocks == 30


def test_mixed_priorities_keep_outputs(family_case):
    directory, prompts, expected = family_case
    llm = LLM(str(directory), dtype="float32", device="cpu", num_kv_blocks=40,
              max_num_batched_tokens=64)  # fmt: skip
    priorities = ["batch" if i % 2 else "interactive" for i in range(len(prompts))]
    outputs = llm.generate(prompts, GREEDY, priority=priorities)
    _assert_same(outputs, expected)
    assert llm.engine.stats().num_free_blocks == 40


def test_piecewise_graph_pieces_keep_outputs(family_case):
    # Steps with prompt chunks through the per-layer pieces (engine/runner/piecewise_graphs.py), run
    # eagerly through the same static buffers on the CPU: padding to a bucket must not change
    # a token. Small chunks make most steps mixed; buckets of 16, 32 and 48 tokens (a step ladder).
    from tests.engine.counting_pieces import attach_counting_pieces

    directory, prompts, expected = family_case
    llm = LLM(str(directory), dtype="float32", device="cpu", num_kv_blocks=512,
              max_num_batched_tokens=48)  # fmt: skip
    runs = attach_counting_pieces(llm.engine.runner, max_tokens=48, bucket_step=16)
    pieces = llm.engine.runner.piecewise
    _assert_same(llm.generate(prompts, GREEDY), expected)
    assert len(runs) > 10 and len({pieces.bucket(n) for n in runs}) >= 3  # padded, mostly
