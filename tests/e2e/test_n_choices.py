# `n` through a real `fleetlm serve` with the openai SDK: n choices, each its own tokens (seeded
# copies differ), streamed chunks that the SDK's per-index accumulation rebuilds into what the
# collected response gives for the same seed; the usage bills the prompt once and every choice's
# tokens; exactly one metering row per request, also when the client goes away mid-stream.
from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(180)

MESSAGES = [{"role": "user", "content": "Tell me three things."}]


def _ask(server, **kw):
    return server.openai().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=1.0, seed=11,
        extra_body={"ignore_eos": True}, **kw,
    )  # fmt: skip


def test_chat_n_collected_and_streamed_agree_and_bill_once(server):
    out = _ask(server, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.message.content for c in out.choices]
    assert len(set(texts)) == 3  # seed + index: independent samples
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.completion_tokens == 18
    one = _ask(server, n=1)
    assert out.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt, once
    assert texts[0] == one.choices[0].message.content  # copy 0 samples with the seed itself

    chunks = list(_ask(server, n=3, stream=True, stream_options={"include_usage": True}))
    streamed = {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == texts
    assert chunks[-1].usage.completion_tokens == 18

    rows = server.usage_rows([out.id, chunks[0].id])
    assert len(rows) == 2  # one row per request, not per choice
    for row in rows:
        assert (row.prompt_tokens, row.completion_tokens) == (out.usage.prompt_tokens, 18)
        assert row.status == "length"


def test_completions_n_and_a_cancelled_stream_bill_one_row(server):
    client = server.openai()
    out = client.completions.create(
        model="tiny", prompt="Once upon", n=2, max_tokens=4, seed=3, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == 8
    stream = client.completions.create(
        model="tiny", prompt="Once upon", n=2, max_tokens=2000, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    seen = 0
    for chunk in stream:
        seen += sum(1 for c in chunk.choices if c.text)
        if seen >= 4:
            break
    cancelled = chunk.id
    stream.close()
    (row,) = server.usage_rows([cancelled], timeout_s=60)
    assert row.status == "cancelled"
    assert row.completion_tokens < 2 * 2000
    (done,) = server.usage_rows([out.id])
    assert done.completion_tokens == 8
