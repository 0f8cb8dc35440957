# Sampled-token logprobs (engine/sampling/logprobs.py) against HF transformers' log-softmax of the
# same checkpoint (float32, CPU): the value of every generated token and the top-k ranks agree; the
# numbers do not depend on the sampling knobs (they are the model's own distribution), and
# overlapped scheduling reports the same ones.
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = pytest.mark.timeout(600)

TINY_CHAT = "models/fleetlm-tiny-chat"
PROMPTS = [[5, 6, 7, 8], [300, 12, 99], [42] * 9]


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(TINY_CHAT, dtype=torch.float32)
    return model.eval()


@torch.no_grad()
def _hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # [len(ids), vocab]: row i predicts token i + 1


@pytest.mark.parametrize("overlap", [False, True])
def test_logprobs_match_hf_log_softmax(hf_model, overlap):
    llm = LLM(
        TINY_CHAT, device="cpu", dtype="float32", num_kv_blocks=64, overlap_scheduling=overlap
    )
    params = [
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=5),
        SamplingParams(
            temperature=0.9, top_k=20, seed=3, max_tokens=8, ignore_eos=True, logprobs=0
        ),
        SamplingParams(temperature=1.0, seed=4, max_tokens=8, ignore_eos=True, logprobs=20),
    ]
    outs = llm.generate(PROMPTS, params)
    for prompt, p, out in zip(PROMPTS, params, outs):
        assert len(out.logprobs) == len(out.token_ids) == 8
        reference = _hf_logprobs(hf_model, prompt + out.token_ids)
        for i, (token, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            row = reference[len(prompt) - 1 + i]
            assert lp.token_id == token
            assert abs(lp.logprob - row[token].item()) < 1e-3
            assert len(lp.top) == p.logprobs
            ids = [t for t, _ in lp.top]
            assert ids == row.topk(p.logprobs).indices.tolist()
            for t, v in lp.top:
                assert abs(v - row[t].item()) < 1e-3


def test_requests_without_logprobs_get_none(hf_model):
    llm = LLM(TINY_CHAT, device="cpu", dtype="float32", num_kv_blocks=64)
    plain, asked = llm.generate(
        PROMPTS[:2],
        [
            SamplingParams(temperature=0, max_tokens=4),
            SamplingParams(temperature=0, max_tokens=4, logprobs=1),
        ],
    )
    assert plain.logprobs is None
    assert len(asked.logprobs) == len(asked.token_ids)


def test_logprobs_bound():
    with pytest.raises(ValueError):
        SamplingParams(logprobs=21)
    assert SamplingParams(logprobs=2).speculative is False


@pytest.mark.parametrize("chunk", [None, 16])
def test_prompt_logprobs_match_hf_through_chunks_and_the_prefix_cache(hf_model, chunk):
    options = {"max_num_batched_tokens": chunk} if chunk else {}
    llm = LLM(TINY_CHAT, device="cpu", dtype="float32", num_kv_blocks=64, **options)
    prompt = list(range(10, 60))
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    # The same prompt twice (and once before): the prefix cache must not skip positions.
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    outs = llm.generate([prompt, prompt], [params, params])
    reference = _hf_logprobs(hf_model, prompt)
    for out in outs:
        assert len(out.prompt_logprobs) == len(prompt) - 1
        for i, entry in enumerate(out.prompt_logprobs):
            row = reference[i]
            assert entry.token_id == prompt[i + 1]
            assert abs(entry.logprob - row[prompt[i + 1]].item()) < 1e-3
            assert [t for t, _ in entry.top] == row.topk(3).indices.tolist()
        assert out.logprobs is None  # sampled-token logprobs are a separate ask


@pytest.mark.parametrize("overlap", [False, True])
def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(hf_model, overlap):
    llm = LLM(
        TINY_CHAT, device="cpu", dtype="float32", num_kv_blocks=64, overlap_scheduling=overlap
    )
    prompt = [7, 8, 9, 10, 11]
    out = llm.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert out.token_ids == [] and out.text == "" and out.finish_reason == "length"
    reference = _hf_logprobs(hf_model, prompt)
    assert len(out.prompt_logprobs) == len(prompt) - 1
    for i, entry in enumerate(out.prompt_logprobs):
        assert abs(entry.logprob - reference[i, prompt[i + 1]].item()) < 1e-3
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)  # nothing to return
