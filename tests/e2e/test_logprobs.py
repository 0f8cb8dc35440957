# logprobs through a real `fleetlm serve` (the engine computes them, the worker publishes them,
# the API shapes them): one entry per generated token, streamed or not, the same numbers either
# way with a seed; the sampled token is among the top ones and its logprob is at most 0.
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.timeout(300)

ASK = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "seed": 5}


def _model(server) -> str:
    return server.openai().models.list().data[0].id


def test_chat_logprobs_streamed_and_not(server):
    client, model = server.openai(), _model(server)
    whole = client.chat.completions.create(model=model, logprobs=True, top_logprobs=3, **ASK)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6
    stream = client.chat.completions.create(
        model=model, logprobs=True, top_logprobs=3, stream=True, **ASK
    )
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]  # fmt: skip
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [
        (e.token, round(e.logprob, 5)) for e in content
    ]


def test_completions_logprobs(server):
    client, model = server.openai(), _model(server)
    out = client.completions.create(model=model, prompt="Hello", max_tokens=5, logprobs=2, seed=1)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(math.isfinite(v) and v <= 0 for v in lp.token_logprobs)
    assert all(len(top) <= 2 for top in lp.top_logprobs)


def test_echo_prompt_logprobs_match_hf(shipped_server):
    transformers = pytest.importorskip("transformers")
    import torch

    from tests.e2e.conftest import ROOT

    path = str(ROOT / "models" / "fleetlm-tiny-chat")
    prompt = "The json module encodes and decodes JSON documents."
    client = shipped_server.openai()
    out = client.completions.create(
        model=_model(shipped_server), prompt=prompt, max_tokens=0, echo=True, logprobs=3
    )
    choice = out.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 0
    from engine.tokenizer import Tokenizer  # the server's tokenizer

    token_ids = Tokenizer.from_pretrained(path).encode(prompt)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([token_ids])).logits[0].float(), -1)
    lp = choice.logprobs
    assert len(lp.token_logprobs) == len(token_ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(token_ids)):
        assert abs(lp.token_logprobs[i] - reference[i - 1, token_ids[i]].item()) < 1e-3
        best = max(lp.top_logprobs[i].values())
        assert abs(best - reference[i - 1].max().item()) < 1e-3
