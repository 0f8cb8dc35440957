# n > 1 (engine/core/request_group.py): the copies share the prompt's KV blocks (copy 0 computes the
# prompt, the others only their partial last block), sample independently (seed + index), and
# read as one request: one id, a choice index per delta, one final delta with the group's usage.
import re

import pytest

from engine import LLM, LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.sampling_params import StructuredOutput
from tests.hf_models import build_hf_model

BLOCK = 16
PROMPT = list(range(5, 5 + 3 * BLOCK + 5))  # 3 full blocks and 5 tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("n_choices")
    build_hf_model(directory, "llama", seed=3)
    return directory


def _engine(model_dir, **options) -> LLMEngine:
    options.setdefault("num_kv_blocks", 64)
    return LLMEngine(EngineConfig(model=str(model_dir), device="cpu", block_size=BLOCK, **options))


def _run(engine: LLMEngine, requests: dict[str, SamplingParams]):
    """Drive to the end; returns the deltas and the prompt tokens each step computed."""
    for request_id, params in requests.items():
        engine.add_request(request_id, PROMPT, params)
    deltas, prompt_tokens = [], 0
    while engine.has_unfinished():
        step = engine.schedule_step()
        for r, n in zip(step.out.requests, step.out.num_new_tokens):
            if r.num_computed_tokens < r.num_prompt_tokens:
                prompt_tokens += n
        deltas += engine.finish_step(engine.launch_step(step))
    return deltas, prompt_tokens


def _choices(deltas, request_id: str, n: int) -> list[list[int]]:
    tokens: list[list[int]] = [[] for _ in range(n)]
    for d in deltas:
        if d.request_id == request_id:
            tokens[d.index] += d.new_token_ids
    return tokens


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "no-cache"])
def test_copies_share_the_prompt_kv(model_dir, prefix_caching):
    engine = _engine(model_dir, enable_prefix_caching=prefix_caching)
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=6, ignore_eos=True, n=4)
    deltas, prompt_tokens = _run(engine, {"r": params})
    tail = len(PROMPT) - 3 * BLOCK  # what each other copy computes of the prompt
    assert prompt_tokens == len(PROMPT) + 3 * tail
    choices = _choices(deltas, "r", 4)
    assert all(len(c) == 6 for c in choices)
    assert len({tuple(c) for c in choices}) == 4  # independent samples
    final = [d for d in deltas if d.finished]
    assert len(final) == 1 and final[0].request_id == "r"
    assert final[0].finish_reasons == ["length"] * 4
    assert final[0].usage.prompt_tokens == len(PROMPT)
    assert final[0].usage.completion_tokens == 24
    # the group's position grows with every delta's tokens, as one request's would
    positions = [d.usage.completion_tokens for d in deltas if d.new_token_ids]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not engine.scheduler.requests
    assert not engine._groups


def test_seeded_copies_are_copy_i_with_seed_plus_i(model_dir):
    n = 3
    params = SamplingParams(temperature=1.0, seed=100, max_tokens=5, ignore_eos=True, n=n)
    deltas, _ = _run(_engine(model_dir), {"a": params})
    again, _ = _run(_engine(model_dir), {"a": params})
    assert _choices(deltas, "a", n) == _choices(again, "a", n)  # deterministic
    singles = {
        f"s{i}": SamplingParams(temperature=1.0, seed=100 + i, max_tokens=5, ignore_eos=True)
        for i in range(n)
    }
    alone, _ = _run(_engine(model_dir), singles)
    assert _choices(deltas, "a", n) == [_choices(alone, f"s{i}", 1)[0] for i in range(n)]


def test_abort_ends_every_copy_once(model_dir):
    engine = _engine(model_dir)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=50, ignore_eos=True, n=3))
    deltas = []
    while sum(len(d.new_token_ids) for d in deltas) < 6:
        deltas += engine.step()
    assert engine.abort("r")
    while engine.has_unfinished():
        deltas += engine.step()
    final = [d for d in deltas if d.finished]
    assert len(final) == 1 and final[0].finish_reason == "abort"
    assert final[0].usage.completion_tokens == sum(len(d.new_token_ids) for d in deltas)
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_a_choice_ending_early_does_not_end_the_request(model_dir):
    engine = _engine(model_dir)
    # greedy copies are equal; a stop id on the first token ends all of them: every copy
    # reports its own end, and only the last delta is final
    deltas, _ = _run(engine, {"r": SamplingParams(temperature=0, max_tokens=4, n=2)})
    ends = [d for d in deltas if d.finish_reason is not None]
    assert [d.finished for d in ends] == [False, True]
    assert sorted(d.index for d in ends) == [0, 1]


def test_offline_generate_returns_each_choice(model_dir):
    with LLM(str(model_dir), device="cpu", num_kv_blocks=64, block_size=BLOCK) as llm:
        params = SamplingParams(temperature=1.0, seed=1, max_tokens=4, ignore_eos=True, n=2)
        (out,) = llm.generate([PROMPT], params)
    assert len(out.choices) == 2
    assert out.token_ids == out.choices[0].token_ids and len(out.choices[1].token_ids) == 4
    assert out.finish_reason == "length"
    assert [c.finish_reason for c in out.choices] == ["length", "length"]


def test_n_is_validated():
    with pytest.raises(ValueError, match="n must be"):
        SamplingParams(n=0)
    with pytest.raises(ValueError, match="n > 1"):
        SamplingParams(n=2, max_tokens=0, prompt_logprobs=0)


def test_overlapped_engine_gives_the_same_choices(model_dir):
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, n=3)
    plain, plain_prompt = _run(_engine(model_dir, overlap_scheduling=False), {"r": params})
    overlapped, prompt = _run(_engine(model_dir, overlap_scheduling=True), {"r": params})
    assert _choices(overlapped, "r", 3) == _choices(plain, "r", 3)
    assert prompt == plain_prompt == len(PROMPT) + 2 * (len(PROMPT) - 3 * BLOCK)


def test_constrained_copies_each_follow_the_grammar():
    # Each copy has its own matcher: every choice matches, and seeded copies differ.
    with LLM("tiny", device="cpu", num_kv_blocks=64) as llm:
        params = SamplingParams(
            temperature=1.0, seed=2, max_tokens=40, n=4,
            structured_output=StructuredOutput("regex", r"[a-z]{3}-[0-9]{2}"),
        )  # fmt: skip
        (out,) = llm.generate([[65, 66, 67] * 7], params)
    texts = [c.text for c in out.choices]
    assert all(re.fullmatch(r"[a-z]{3}-[0-9]{2}", t) for t in texts), texts
    assert len(set(texts)) > 1
    assert [c.finish_reason for c in out.choices] == ["stop"] * 4
