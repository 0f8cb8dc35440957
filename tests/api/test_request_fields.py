# Which request fields the API takes (docs/serving.md#request-fields): vLLM's sampling extras are
# forwarded to the worker; an unknown field is a 400 naming it; a field that OpenAI or vLLM
# defines and fleetlm does not implement passes only at a value that asks for nothing.
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine.sampling_params import SamplingParams
from tests.api.conftest import bad_request, sdk

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}]


def test_vllm_extras_reach_the_worker(app_client, tenant, worker):
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            client.chat.completions.create,
            model="tiny",
            messages=MESSAGES,
            max_tokens=5,
            extra_body={
                "skip_special_tokens": False,
                "include_stop_str_in_output": True,
                "spaces_between_special_tokens": False,
                "ignore_eos": True,
                "top_k": 5,
            },
        )
        queued = worker.take(tenant)
        worker.publish(queued.request_id, worker.done("ok", len(queued.prompt_token_ids), 1))
        assert reply.result(timeout=30).choices[0].message.content == "ok"
    assert queued.sampling == SamplingParams(
        max_tokens=5,
        top_k=5,
        ignore_eos=True,
        skip_special_tokens=False,
        include_stop_str_in_output=True,
    )


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"best_effort": True}, "/v1/chat/completions"),
        ({"guided_yaml": {"type": "object"}}, "/v1/chat/completions"),
        ({"temprature": 0.5}, "/v1/completions"),
        ({"tools": []}, "/v1/completions"),  # a chat field
    ],
)
def test_an_unknown_field_is_a_400_naming_it(app_client, tenant, body, path):
    error = bad_request(app_client, tenant.key, body, path)
    (name,) = body
    assert error["param"] == name
    assert name in error["message"]


def test_an_unknown_stream_option_is_a_400(app_client, tenant):
    body = {"stream": True, "stream_options": {"include_usage": True, "per_token": True}}
    error = bad_request(app_client, tenant.key, body)
    assert error["param"] == "stream_options"
    assert "per_token" in error["message"]
    body = {"stream": True, "stream_options": {"include_obfuscation": True}}
    assert bad_request(app_client, tenant.key, body)["param"] == "stream_options"


@pytest.mark.parametrize(
    "field",
    [
        {"store": True},
        {"reasoning_effort": "low"},
        {"use_beam_search": True},
        {"add_generation_prompt": False},
    ],
)
def test_an_unimplemented_field_that_asks_for_something_is_a_400(app_client, tenant, field):
    error = bad_request(app_client, tenant.key, field)
    (name,) = field
    assert error["param"] == name
    assert "not supported" in error["message"]


def test_unimplemented_fields_at_their_no_op_values_are_accepted(app_client, tenant, worker):
    # What SDKs and load tools send when their options are off.
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            client.chat.completions.create,
            model="tiny",
            messages=MESSAGES,
            max_tokens=3,
            stop=None,
            tools=[],
            tool_choice="none",
            parallel_tool_calls=False,
            response_format={"type": "text"},
            logit_bias={},
            store=False,
            prompt_cache_key="session-1",
            frequency_penalty=0,
            presence_penalty=0,
            logprobs=False,
            stream=True,
            stream_options={"include_usage": True, "include_obfuscation": False},
            extra_body={"min_p": 0, "repetition_penalty": 1.0, "use_beam_search": False},
        )
        queued = worker.take(tenant)
        worker.publish(queued.request_id, worker.done("ok", len(queued.prompt_token_ids), 1))
        chunks = list(reply.result(timeout=30))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    assert chunks[-1].usage.completion_tokens == 1


def test_the_sdk_surfaces_the_rejection(app_client, tenant):
    client = sdk(app_client, tenant.key)
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="tiny", prompt="hi", extra_body={"beam_width": 4})
    assert exc.value.body["param"] == "beam_width"
