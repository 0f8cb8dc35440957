# Bounded cost per request, at the edge: bodies over the limit refused before parsing, stop
# strings bounded like OpenAI's, strict types, bounded min_tokens and stop_token_ids, JSON that
# cannot be decoded (or carries unpaired surrogates) refused with a 400 naming the field; and
# /health keeps answering while the expensive cases are refused.
from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import SETTINGS

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "user", "content": "hi"}]


def post(client: TestClient, key: str, path: str = "/v1/chat/completions", **kw: Any):
    headers = {"Authorization": f"Bearer {key}", **kw.pop("headers", {})}
    return client.post(path, headers=headers, **kw)


def post_raw(client: TestClient, key: str, path: str, body: bytes):
    """`body` as is, declared JSON."""
    return post(client, key, path, content=body, headers={"content-type": "application/json"})


def chat(client: TestClient, key: str, **fields: Any):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4} | fields
    return post(client, key, json=body)


def assert_400(response, param: str | None, code: str | None = None) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["code"] is not None, error
    if code is not None:
        assert error["code"] == code, error
    return error


def while_health_answers(app_client: TestClient, work: Callable[[], Any]) -> Any:
    """Runs `work` in a thread; meanwhile /health must keep answering (each within a generous
    bound). Returns what `work` returned, which must come back within 60 s."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(work)
        answered = 0
        while not future.done() or answered == 0:
            started = time.monotonic()
            assert app_client.get("/health").status_code == 200
            assert time.monotonic() - started < 10, "/health stalled behind the request"
            answered += 1
        return future.result(timeout=60)


def test_a_10_mb_body_is_refused_before_parsing(app_client, tenant):
    prompt = "x" * (10 * 2**20)
    refused = while_health_answers(app_client, lambda: chat(app_client, tenant.key, messages=[
        {"role": "user", "content": prompt}]))  # fmt: skip
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "request_too_large"
    limit = SETTINGS.resolved_max_request_bytes()
    assert str(limit) in refused.json()["error"]["message"]


def test_a_body_without_content_length_is_cut_at_the_limit(app_client, tenant):
    def chunks():
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}]}'

    refused = post(app_client, tenant.key, content=chunks())
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "request_too_large"


def test_long_prompts_are_prepared_off_the_event_loop(app_client, tenant):
    # Just under the body limit: decoded, templated and tokenised (in the threadpool), then
    # refused for the context; /health answers throughout.
    prompt = "z" * (SETTINGS.resolved_max_request_bytes() - 1000)

    def four_at_once():
        with ThreadPoolExecutor(4) as pool:
            body = {"messages": [{"role": "user", "content": prompt}]}
            return list(pool.map(lambda _: chat(app_client, tenant.key, **body), range(4)))

    for refused in while_health_answers(app_client, four_at_once):
        assert_400(refused, "messages", "context_length_exceeded")


def test_stop_strings_are_bounded_and_refused_quickly(app_client, tenant):
    too_long = "s" * (SETTINGS.max_stop_chars + 1)
    error = assert_400(chat(app_client, tenant.key, stop=[too_long]), "stop", "invalid_value")
    assert str(SETTINGS.max_stop_chars) in error["message"]
    # The case that took a worker to 5.8 GB: four stop strings of 100,000 characters.
    huge = [c * 100_000 for c in "abcd"]
    refused = while_health_answers(app_client, lambda: chat(app_client, tenant.key, stop=huge))
    assert_400(refused, "stop")
    assert_400(chat(app_client, tenant.key, stop=list("abcde")), "stop")  # at most 4
    assert_400(chat(app_client, tenant.key, stop=[""]), "stop")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 8.5}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"temperature": "0.5"}, "temperature"),
        ({"seed": "1"}, "seed"),
        ({"ignore_eos": "true"}, "ignore_eos"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ],
)
def test_numbers_and_booleans_are_strict(app_client, tenant, fields, param):
    assert_400(chat(app_client, tenant.key, **fields), param, "invalid_type")


def test_min_tokens_and_stop_token_ids_are_bounded(app_client, tenant):
    error = assert_400(
        chat(app_client, tenant.key, max_tokens=None, min_tokens=10**9), "min_tokens"
    )
    assert "context" in error["message"]
    assert_400(chat(app_client, tenant.key, max_tokens=4, min_tokens=5), "min_tokens")
    assert_400(chat(app_client, tenant.key, stop_token_ids=[10**6]), "stop_token_ids")
    assert_400(chat(app_client, tenant.key, stop_token_ids=[-1]), "stop_token_ids")
    completion = {"model": "tiny", "prompt": "hi", "stop_token_ids": [2**40]}
    assert_400(post(app_client, tenant.key, "/v1/completions", json=completion), "stop_token_ids")


def test_request_metadata_follows_openai_limits(app_client, tenant):
    for metadata in (
        {f"k{i}": "v" for i in range(17)},
        {"k" * 65: "v"},
        {"k": "v" * 513},
        {"k": "a\x00b"},
    ):
        assert_400(chat(app_client, tenant.key, metadata=metadata), "metadata")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "tiny", "messages": [',  # truncated
        b"\xff\xfe",  # not UTF-8
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the decoder's stack
        b'{"model": "tiny", "max_tokens": ' + b"9" * 5000 + b"}",  # over Python's digit limit
    ],
)
def test_a_body_that_is_not_json_is_400_without_an_offset(app_client, tenant, body):
    response = post_raw(app_client, tenant.key, "/v1/chat/completions", body)
    assert_400(response, None, "invalid_json")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", '{"model": "t\\ud800", "messages": []}', "model"),
        ("/v1/completions", '{"model": "tiny", "prompt": "a\\udfff"}', "prompt"),
        ("/v1/completions", '{"model": "tiny", "prompt": ["\\ud800"]}', "prompt"),
        (
            "/v1/chat/completions",
            '{"model": "tiny", "messages": [{"role": "user", "content": "\\ud83d"}]}',
            "messages",
        ),
        ("/v1/chat/completions", '{"model": "tiny", "\\ud800": 1, "messages": []}', "\ufffd"),
    ],
)
def test_unpaired_surrogates_are_400(app_client, tenant, path, body, param):
    response = post_raw(app_client, tenant.key, path, body.encode())
    error = assert_400(response, param, "invalid_value")
    assert "surrogate" in error["message"]
    # A surrogate pair is one character, not an error.
    paired = json.dumps({"model": "tiny", "prompt": "\U0001f642", "max_tokens": 5000})
    response = post_raw(app_client, tenant.key, "/v1/completions", paired.encode())
    assert_400(response, "prompt", "context_length_exceeded")


def test_a_prompt_longer_than_the_context_could_hold_is_refused_before_tokenising(
    app_client, tenant
):
    # More characters than max_model_len tokens can stand for (each at most max_token_chars):
    # refused on its length alone, whatever the tokenizer would make of it.
    from engine.tokenizer import Tokenizer

    limit = SETTINGS.resolved_max_model_len()
    most = limit * Tokenizer.for_model(SETTINGS.model).max_token_chars
    prompt = "q" * (most + 100)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4}
    error = assert_400(
        post(app_client, tenant.key, "/v1/completions", json=body),
        "prompt",
        "context_length_exceeded",
    )
    assert f"{len(prompt)} characters" in error["message"], error
    messages = [{"role": "user", "content": prompt}]
    error = assert_400(chat(app_client, tenant.key, messages=messages), "messages")
    assert f"{len(prompt)} characters" in error["message"], error


def test_prepare_grammars_builds_the_vocabulary_before_any_schema():
    # llguidance reads the vocabulary holding the interpreter lock: the API's lifespan calls
    # this before serving, so the first request with a schema compiles only its grammar.
    from engine.tokenizer import Tokenizer
    from service.prepare import _grammar_compiler, prepare_grammars

    tokenizer = Tokenizer.for_model("tiny")
    prepare_grammars(tokenizer)
    compiler = _grammar_compiler(tokenizer)
    assert compiler._tokenizer is not None and compiler.num_compiled == 0
