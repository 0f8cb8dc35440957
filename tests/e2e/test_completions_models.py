# /v1/completions, /v1/models, /health and /ready.
from __future__ import annotations

import httpx
import pytest

from engine.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(60)


def test_completion_with_a_string_prompt(server):
    out = server.openai().completions.create(model="tiny", prompt="Once upon a time", max_tokens=7)
    assert out.object == "text_completion"
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == len(Tokenizer.for_model("tiny").encode("Once upon a time"))
    assert out.usage.completion_tokens == 7


def test_completion_with_token_ids_equals_the_string_prompt(server):
    client = server.openai()
    ids = Tokenizer.for_model("tiny").encode("Hello there")
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(
        model="tiny", prompt="Hello there", max_tokens=8, temperature=0
    )
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_completion_stream_with_usage(server):
    chunks = list(
        server.openai().completions.create(
            model="tiny",
            prompt="abc",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"


def test_models(server):
    models = server.openai().models.list()
    (card,) = models.data
    assert card.id == "tiny" and card.object == "model" and card.owned_by == "fleetlm"
    assert card.model_extra["max_model_len"] == 4096  # 256 KV blocks x 16 tokens
    assert card.model_extra["vocab_size"] == 8192  # the tiny preset: token ids below it
    assert server.openai().models.retrieve("tiny").id == "tiny"


def test_health_and_ready(server):
    assert httpx.get(server.base_url + "/health", timeout=5).json() == {"status": "ok"}
    ready = httpx.get(server.base_url + "/ready", timeout=5)
    assert ready.status_code == 200
    assert ready.json()["workers"] == 1 and ready.json()["database"] is True
