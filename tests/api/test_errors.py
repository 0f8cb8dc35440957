# OpenAI-shaped errors with the right status codes.
from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}]


def test_bad_key_is_401(server):
    import openai as sdk

    client = sdk.OpenAI(base_url=server.base_url + "/v1", api_key="flm-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        client.chat.completions.create(model="tiny", messages=MESSAGES)
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "invalid_api_key"
    r = httpx.post(server.base_url + "/v1/chat/completions", json={}, timeout=10)
    assert r.status_code == 401
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError) as exc:
        server.openai().chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert exc.value.body["code"] == "model_not_found"
    assert exc.value.body["param"] == "model"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"temperature": 3.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"min_tokens": 9}, "max_tokens": 3}, "min_tokens"),
    ],
)
def test_invalid_parameter_is_400_with_param(server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as exc:
        server.openai().chat.completions.create(model="tiny", messages=MESSAGES, **kwargs)
    assert exc.value.status_code == 400
    assert exc.value.body["param"] == param
    assert exc.value.body["type"] == "invalid_request_error"


def test_context_length_exceeded_is_400(server):
    long = "x" * 5000  # > 4096 tokens with the byte tokenizer
    with pytest.raises(openai.BadRequestError) as exc:
        server.openai().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": long}]
        )
    assert exc.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        server.openai().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4090)
    assert exc.value.body["code"] == "context_length_exceeded"


def test_empty_messages_is_400(server):
    with pytest.raises(openai.BadRequestError) as exc:
        server.openai().chat.completions.create(model="tiny", messages=[])
    assert exc.value.body["param"] == "messages"
