# logprobs at the API (the test plays the worker, which sends each token's logprobs in OpenAI's
# chat shape on its events): chat's `logprobs` + `top_logprobs` reach the worker as one count
# and come back in `choices[].logprobs.content`, streamed per chunk; completions' `logprobs` comes
# back in the legacy shape (tokens, token_logprobs, top_logprobs, text_offset); bad values 400.
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.api.conftest import bad_request, sdk

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}]


def _entry(token: str, lp: float) -> dict:
    top = [{"token": token, "logprob": lp, "bytes": list(token.encode())},
           {"token": "x", "logprob": lp - 1, "bytes": [120]}]  # fmt: skip
    return {"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": top}


def _play(app_client, tenant, worker, call):
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(call, client)
        queued = worker.take(tenant)
        n = len(queued.prompt_token_ids)
        worker.publish(
            queued.request_id, worker.delta("He", 1) | {"logprobs": [_entry("He", -0.5)]}
        )
        done = worker.done("llo", n, 2) | {"logprobs": [_entry("llo", -1.25)]}
        worker.publish(queued.request_id, done)
        return queued, reply.result(timeout=30)


def test_chat_logprobs_round_trip(app_client, tenant, worker):
    def call(client):
        return client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, logprobs=True, top_logprobs=2
        )

    queued, out = _play(app_client, tenant, worker, call)
    assert queued.sampling.logprobs == 2
    content = out.choices[0].logprobs.content
    assert [(c.token, c.logprob) for c in content] == [("He", -0.5), ("llo", -1.25)]
    assert [t.token for t in content[0].top_logprobs] == ["He", "x"]


def test_chat_logprobs_stream_per_chunk(app_client, tenant, worker):
    def call(client):
        stream = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, logprobs=True, stream=True
        )
        return list(stream)

    queued, chunks = _play(app_client, tenant, worker, call)
    assert queued.sampling.logprobs == 0
    entries = [e.token for c in chunks if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]  # fmt: skip
    assert entries == ["He", "llo"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"


def test_completions_logprobs_in_the_legacy_shape(app_client, tenant, worker):
    def call(client):
        return client.completions.create(model="tiny", prompt="hi", max_tokens=5, logprobs=2)

    queued, out = _play(app_client, tenant, worker, call)
    assert queued.sampling.logprobs == 2
    lp = out.choices[0].logprobs
    assert lp.tokens == ["He", "llo"]
    assert lp.token_logprobs == [-0.5, -1.25]
    assert lp.top_logprobs[1] == {"llo": -1.25, "x": -2.25}
    assert lp.text_offset == [0, 2]


def test_no_logprobs_unless_asked(app_client, tenant, worker):
    def call(client):
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5)

    queued, _ = _play(app_client, tenant, worker, call)
    assert queued.sampling.logprobs is None


@pytest.mark.parametrize(
    ("body", "param", "path"),
    [
        ({"top_logprobs": 2}, "top_logprobs", "/v1/chat/completions"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "/v1/chat/completions"),
        ({"logprobs": "yes"}, "logprobs", "/v1/chat/completions"),
        ({"logprobs": 21}, "logprobs", "/v1/completions"),
        ({"logprobs": -1}, "logprobs", "/v1/completions"),
    ],
)
def test_bad_logprobs_are_400s(app_client, tenant, body, param, path):
    assert bad_request(app_client, tenant.key, body, path)["param"] == param


def test_echo_puts_the_prompt_and_its_logprobs_first(app_client, tenant, worker):
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            client.completions.create,
            model="tiny", prompt="ab", max_tokens=0, echo=True, logprobs=1,
        )  # fmt: skip
        queued = worker.take(tenant)
        assert queued.sampling.prompt_logprobs == 1
        done = worker.done("", len(queued.prompt_token_ids), 0) | {
            "prompt_logprobs": [_entry("b", -2.0)]
        }
        worker.publish(queued.request_id, done)
        out = reply.result(timeout=30)
    lp = out.choices[0].logprobs
    assert out.choices[0].text == "ab"
    assert lp.tokens == ["a", "b"]
    assert lp.token_logprobs == [None, -2.0]
    assert lp.top_logprobs[0] is None
    assert lp.text_offset == [0, 1]


def test_echo_without_logprobs_streams_the_prompt_first(app_client, tenant, worker):
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            lambda: list(client.completions.create(
                model="tiny", prompt="ab", max_tokens=2, echo=True, stream=True
            ))
        )  # fmt: skip
        queued = worker.take(tenant)
        assert queued.sampling.prompt_logprobs is None  # the prefix cache stays usable
        worker.publish(queued.request_id, worker.delta("c", 1), worker.done("d", 2, 2))
        chunks = reply.result(timeout=30)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "abcd"


@pytest.mark.parametrize("body", [{"max_tokens": 0}, {"echo": "yes"}, {"echo": 1}])
def test_bad_echo_values_are_400s(app_client, tenant, body):
    assert bad_request(app_client, tenant.key, body, "/v1/completions")["param"] == next(iter(body))
