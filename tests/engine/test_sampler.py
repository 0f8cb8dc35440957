import pytest
import torch

from engine.core.request import Priority, Request
from engine.sampling.sampler import SamplingBatch, sample
from engine.sampling_params import SamplingParams


def _batch(params: list[SamplingParams], vocab: int, seeded: bool = False) -> SamplingBatch:
    reqs = []
    for i, p in enumerate(params):
        r = Request(f"r{i}", [1], p, Priority.INTERACTIVE, 16)
        if seeded and p.seed is not None:
            r.generator = torch.Generator().manual_seed(p.seed)
        reqs.append(r)
    return SamplingBatch.from_requests(reqs, vocab, torch.device("cpu"), eos_ids=(0,))


def test_greedy_is_argmax():
    logits = torch.randn(4, 50)
    out = sample(logits.clone(), _batch([SamplingParams(temperature=0)] * 4, 50))
    assert out.tolist() == logits.argmax(-1).tolist()


def test_bf16_logits_sample_as_their_float32_upcast():
    # Decode graphs hand the sampler bf16 logits: greedy rows take the argmax in bf16 (ties
    # included: many bf16 values repeat), sampled rows draw as from the float32 upcast.
    logits = (torch.randn(16, 300) * 4).to(torch.bfloat16)
    greedy = _batch([SamplingParams(temperature=0)] * 16, 300)
    assert sample(logits.clone(), greedy).tolist() == sample(logits.float(), greedy).tolist()
    mixed = [SamplingParams(temperature=0.8, seed=i) if i % 2 else SamplingParams(temperature=0)
             for i in range(16)]  # fmt: skip
    a = sample(logits.clone(), _batch(mixed, 300, seeded=True))
    b = sample(logits.float(), _batch(mixed, 300, seeded=True))
    assert a.tolist() == b.tolist()


def test_top_k_one_equals_greedy_at_any_temperature():
    logits = torch.randn(8, 100)
    params = [SamplingParams(temperature=1.5, top_k=1)] * 8
    assert sample(logits.clone(), _batch(params, 100)).tolist() == logits.argmax(-1).tolist()


def test_same_seed_same_tokens_different_seed_differs():
    logits = torch.randn(1, 1000)

    def draw(seed: int) -> list[int]:
        b = _batch([SamplingParams(temperature=1.0, seed=seed)], 1000, seeded=True)
        return [sample(logits.clone(), b).item() for _ in range(20)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_seeded_row_ignores_its_batch_neighbours():
    torch.manual_seed(0)
    logits = torch.randn(3, 500)
    alone = _batch([SamplingParams(temperature=1.0, seed=3)], 500, seeded=True)
    first = [sample(logits[1:2].clone(), alone).item() for _ in range(10)]
    mixed = _batch(
        [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, seed=3),
         SamplingParams(temperature=0)], 500, seeded=True,
    )  # fmt: skip
    second = [sample(logits.clone(), mixed)[1].item() for _ in range(10)]
    assert first == second


def test_top_p_keeps_the_smallest_nucleus_with_renormalised_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(20_000, 4).contiguous()
    params = [SamplingParams(temperature=1.0, top_p=0.7)] * 20_000
    torch.manual_seed(1)
    tokens = sample(logits.clone(), _batch(params, 4))
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    # 0.5 + 0.3 ≥ 0.7: only tokens 0 and 1 survive, renormalised to 0.625 / 0.375.
    assert freq[2] == 0 and freq[3] == 0
    assert freq[0] == pytest.approx(0.625, abs=0.015)
    assert freq[1] == pytest.approx(0.375, abs=0.015)


def test_temperature_sampling_matches_the_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().expand(20_000, 4).contiguous()
    torch.manual_seed(2)
    tokens = sample(logits.clone(), _batch([SamplingParams(temperature=1.0)] * 20_000, 4))
    freq = torch.bincount(tokens, minlength=4).float() / tokens.numel()
    assert torch.allclose(freq, probs, atol=0.015)


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.full((1, 10), -5.0)
    logits[0, 0] = 10.0  # EOS (id 0) is by far the most likely
    logits[0, 3] = 9.0  # then a stop token id
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3])
    assert sample(logits.clone(), _batch([p], 10)).item() not in (0, 3)
    # Without min_tokens, EOS wins.
    assert sample(logits.clone(), _batch([SamplingParams(temperature=0)], 10)).item() == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"max_tokens": 0},
        {"min_tokens": 5, "max_tokens": 2},
        {"stop": [""]},
        {"seed": -1},
    ],
)
def test_invalid_sampling_params_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
