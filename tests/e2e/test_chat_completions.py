# /v1/chat/completions end to end through Redis and a real worker, with the official openai SDK.
from __future__ import annotations

import string
import uuid

import pytest

from engine.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(90)

MESSAGES = [{"role": "user", "content": "Say something."}]


def chat_prompt_len(messages) -> int:
    return len(Tokenizer.for_model("tiny").apply_chat_template(messages, tokenize=True))


def test_non_stream(server):
    out = server.openai().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0
    )
    assert out.object == "chat.completion"
    assert out.id.startswith("chatcmpl-")
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"  # tiny has no EOS: it runs to max_tokens
    assert out.usage.prompt_tokens == chat_prompt_len(MESSAGES)
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    assert out.usage.prompt_tokens_details.cached_tokens is not None


def test_stream_matches_non_stream(server):
    client = server.openai()
    ref = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=16, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stream=True
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert all(c.usage is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == ref.choices[0].message.content


def test_stream_include_usage(server):
    chunks = list(
        server.openai().chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens == chat_prompt_len(MESSAGES)
    assert last.usage.prompt_tokens_details.cached_tokens >= 0
    assert chunks[-2].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_string(server):
    client = server.openai()
    ref = (
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=64, temperature=0
        )
        .choices[0]
        .message.content
    )
    visible = string.ascii_letters + string.digits + string.punctuation
    printable = [ch for ch in ref if ch in visible]
    assert printable, f"the greedy reference has no printable character to stop on: {ref!r}"
    stop = printable[len(printable) // 2]
    expected = ref[: ref.index(stop)]
    out = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=64, temperature=0, stop=[stop, "\x00never"]
    )
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.content == expected
    streamed = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=64, temperature=0, stop=stop, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_max_completion_tokens_gives_length(server):
    out = server.openai().chat.completions.create(
        model="tiny", messages=MESSAGES, max_completion_tokens=3
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 3


def test_cached_tokens_on_repeated_long_prompt(server):
    system = f"[{uuid.uuid4().hex}] " + "You are a careful assistant. " * 30
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]
    client = server.openai()
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    n = second.usage.prompt_tokens
    assert n > 500
    assert first.usage.prompt_tokens_details.cached_tokens < 16
    # Everything but the last, partial block comes from the prefix cache.
    assert second.usage.prompt_tokens_details.cached_tokens >= (n - 1) // 16 * 16 - 16


def test_flex_tier_runs_in_the_batch_class(server):
    out = server.openai().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, service_tier="flex"
    )
    record = server.usage_record(out.id)
    assert record.priority == "batch"
    assert record.status == "length" and record.finish_reason == "length"
    assert record.endpoint == "chat.completions" and record.model == "tiny"
    assert record.counts["completion_tokens"] == 2
    assert record.counts["prompt_tokens"] == out.usage.prompt_tokens
    assert 0 <= record.queue_ms <= record.ttft_ms <= record.e2e_ms
    assert record.tpot_ms > 0
    assert record.worker_id == server.workers_stats()[0]["id"]
