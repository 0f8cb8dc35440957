# `n` at the API (the test plays the worker, which interleaves the choices' events, each with
# its index): the real openai SDK gets n choices, streamed (each chunk names its choice; a choice
# that ends early gets its finish_reason at once, the rest with the final event) and collected;
# the usage counts the prompt once and every choice's tokens; bounds and conflicts are 400s
# naming `n`.
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import bad_request, sdk

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}]


def _play(app_client, tenant, worker, call):
    """Three choices: 1 ends first ("stop"), then 0 and 2 end with the final event."""
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(call, client)
        queued = worker.take(tenant)
        rid = queued.request_id
        worker.publish(
            rid,
            worker.delta("a", 1) | {"index": 0},
            worker.delta("B", 2) | {"index": 1},
            worker.delta("c", 3) | {"index": 2},
            worker.delta("B!", 4) | {"index": 1, "finish_reason": "stop"},
            worker.delta("aa", 5) | {"index": 0},
        )
        done = worker.done("cc", len(queued.prompt_token_ids), 6)
        worker.publish(rid, done | {"index": 2, "finish_reasons": ["length", "stop", "length"]})
        return queued, reply.result(timeout=30)


def test_chat_n_collected(app_client, tenant, worker):
    queued, out = _play(
        app_client,
        tenant,
        worker,
        lambda c: c.chat.completions.create(model="tiny", messages=MESSAGES, n=3, max_tokens=4),
    )
    assert queued.sampling.n == 3
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.message.content for c in out.choices] == ["aaa", "BB!", "ccc"]
    assert [c.finish_reason for c in out.choices] == ["length", "stop", "length"]
    assert out.usage.prompt_tokens == len(queued.prompt_token_ids)
    assert out.usage.completion_tokens == 6


def test_chat_n_streamed_rebuilds_each_choice(app_client, tenant, worker):
    def call(client):
        stream = client.chat.completions.create(
            model="tiny", messages=MESSAGES, n=3, max_tokens=4, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        return list(stream)

    _, chunks = _play(app_client, tenant, worker, call)
    text, reasons, roles = {}, {}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            text[choice.index] = text.get(choice.index, "") + (choice.delta.content or "")
            if choice.delta.role:
                roles[choice.index] = choice.delta.role
            if choice.finish_reason:
                assert choice.index not in reasons  # once per choice
                reasons[choice.index] = choice.finish_reason
    assert text == {0: "aaa", 1: "BB!", 2: "ccc"}
    assert reasons == {0: "length", 1: "stop", 2: "length"}
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert chunks[-1].usage.completion_tokens == 6


def test_completions_n_streamed_and_collected(app_client, tenant, worker):
    def call(client):
        return client.completions.create(model="tiny", prompt="hi", n=3, max_tokens=4)

    _, out = _play(app_client, tenant, worker, call)
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [
        (0, "aaa", "length"), (1, "BB!", "stop"), (2, "ccc", "length"),
    ]  # fmt: skip

    def stream(client):
        return list(
            client.completions.create(model="tiny", prompt="hi", n=3, max_tokens=4, stream=True)
        )

    _, chunks = _play(app_client, tenant, worker, stream)
    text = {}
    for chunk in chunks:
        for choice in chunk.choices:
            text[choice.index] = text.get(choice.index, "") + choice.text
    assert text == {0: "aaa", 1: "BB!", 2: "ccc"}


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"n": 17}, "/v1/chat/completions"),
        ({"n": 0}, "/v1/chat/completions"),
        ({"n": "2"}, "/v1/chat/completions"),
        ({"n": 2, "best_of": 1}, "/v1/completions"),
        ({"n": 2, "max_tokens": 0, "echo": True}, "/v1/completions"),
    ],
)
def test_bad_n_is_400_naming_n(app_client, tenant, body, path):
    assert bad_request(app_client, tenant.key, body, path)["param"] == "n"


def test_completions_echo_with_n_echoes_the_prompt_in_every_choice(app_client, tenant, worker):
    # The prompt's logprobs come once, with choice 0's first delta: every choice shows them.
    prompt_lp = [{"token": "i", "logprob": -2.0, "bytes": [105], "top_logprobs": []}]

    def entry(token: str) -> dict:
        return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}

    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            lambda: client.completions.create(
                model="tiny", prompt="hi", n=2, max_tokens=1, echo=True, logprobs=0
            )
        )
        queued = worker.take(tenant)
        worker.publish(
            queued.request_id,
            worker.delta("A", 1)
            | {"index": 0, "logprobs": [entry("A")], "prompt_logprobs": prompt_lp},
            worker.delta("B", 2) | {"index": 1, "logprobs": [entry("B")]},
        )
        done = worker.done("", len(queued.prompt_token_ids), 2)
        worker.publish(queued.request_id, done | {"index": 1, "finish_reasons": ["length"] * 2})
        out = reply.result(timeout=30)
    assert [c.text for c in out.choices] == ["hiA", "hiB"]
    assert [c.logprobs.tokens for c in out.choices] == [["h", "i", "A"], ["h", "i", "B"]]
