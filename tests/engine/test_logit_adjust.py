# logit_bias, the penalties and min_p in the batched sampler (engine/sampling/logit_adjust.py,
# engine/sampling/sampler.py) against a per-row reference written from their definitions; a mixed
# batch leaves the rows that ask for nothing untouched; through the engine, a bias forces its token.
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.request import Priority, Request
from engine.sampling.sampler import SamplingBatch, sample, target_probs

VOCAB = 40


def _request(params: SamplingParams, output: list[int]) -> Request:
    r = Request("r", [1, 2, 3, 3], params, Priority.INTERACTIVE, 64)
    r.token_ids += output
    return r


def _reference(logits: torch.Tensor, r: Request) -> torch.Tensor:
    p, out = r.params, r.output_token_ids
    row = logits.clone()
    for t, b in (p.logit_bias or {}).items():
        row[t] += b
    seen = set(out) | (
        set(r.token_ids[: r.num_prompt_tokens]) if p.repetition_penalty != 1 else set()
    )
    for t in seen:
        row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
    for t in set(out):
        row[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
    return row


def test_bias_and_penalties_match_the_per_row_reference():
    torch.manual_seed(0)
    logits = torch.randn(5, VOCAB) * 3
    requests = [
        _request(SamplingParams(temperature=0, logit_bias={4: 7.5, 9: -100}), [4, 4]),
        _request(SamplingParams(temperature=0), [5, 6]),  # asks for nothing
        _request(SamplingParams(temperature=0, frequency_penalty=1.5), [7, 7, 8]),
        _request(SamplingParams(temperature=0, presence_penalty=-0.5), [2, 7, 7]),
        _request(SamplingParams(temperature=0, repetition_penalty=1.7), [10, 3]),
    ]
    batch = SamplingBatch.from_requests(requests, VOCAB, torch.device("cpu"), (0,))
    adjusted = batch.adjust.apply(logits.clone())
    for i, r in enumerate(requests):
        assert torch.allclose(adjusted[i], _reference(logits[i], r), atol=1e-6), i
    expected = torch.stack([_reference(logits[i], r) for i, r in enumerate(requests)]).argmax(-1)
    assert sample(logits.clone(), batch).tolist() == expected.tolist()


def test_min_p_drops_what_is_below_its_share_of_the_top():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    requests = [_request(SamplingParams(min_p=0.4), []), _request(SamplingParams(), [])]
    batch = SamplingBatch.from_requests(requests, 4, torch.device("cpu"), (0,))
    probs = target_probs(logits, batch)
    assert probs[0].tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])
    assert probs[1].tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05])


def test_nothing_asked_builds_nothing():
    batch = SamplingBatch.from_requests(
        [_request(SamplingParams(), [1])], VOCAB, torch.device("cpu"), (0,)
    )
    assert batch.adjust is None and batch.min_p is None


@pytest.mark.parametrize(
    "bad",
    [{"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0},
     {"min_p": 1.5}, {"logit_bias": {3: 101}}],
)  # fmt: skip
def test_out_of_range_values_are_value_errors(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


@pytest.mark.parametrize("overlap", [False, True])
def test_through_the_engine(overlap):
    llm = LLM("tiny", device="cpu", num_kv_blocks=64, overlap_scheduling=overlap)
    forced = llm.generate(
        [[65, 66]], SamplingParams(temperature=1.0, max_tokens=6, logit_bias={120: 100})
    )[0]
    assert forced.token_ids == [120] * 6
    # A large frequency penalty on greedy decoding: no token repeats.
    varied = llm.generate(
        [[65, 66]],
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, frequency_penalty=2.0,
                       logit_bias={t: 5.0 for t in range(97, 123)}),
    )[0]  # fmt: skip
    assert len(set(varied.token_ids)) == len(varied.token_ids)
    with pytest.raises(ValueError):
        llm.generate([[1]], SamplingParams(logit_bias={10**9: 1.0}))
