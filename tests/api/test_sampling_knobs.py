# logit_bias, min_p and the penalties at the API: they reach the worker as the engine's
# SamplingParams fields (token-id keys as ints), and out-of-range values are 400s naming them.
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.sampling_params import SamplingParams
from tests.api.conftest import bad_request, sdk

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}]


def test_the_knobs_reach_the_worker(app_client, tenant, worker):
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            client.chat.completions.create,
            model="tiny", messages=MESSAGES, max_tokens=3,
            presence_penalty=0.5, frequency_penalty=-1.0, logit_bias={"42": 10, "7": -100},
            extra_body={"min_p": 0.05, "repetition_penalty": 1.3},
        )  # fmt: skip
        queued = worker.take(tenant)
        worker.publish(queued.request_id, worker.done("ok", len(queued.prompt_token_ids), 1))
        assert reply.result(timeout=30).choices[0].message.content == "ok"
    s = queued.sampling
    assert (s.presence_penalty, s.frequency_penalty, s.min_p, s.repetition_penalty) == (
        0.5, -1.0, 0.05, 1.3,
    )  # fmt: skip
    params = SamplingParams(**{k: getattr(s, k) for k in ("logit_bias", "min_p")})
    assert params.logit_bias == {42: 10.0, 7: -100.0}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"logit_bias": {"42": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
    ],
)
def test_out_of_range_knobs_are_400s(app_client, tenant, body, param):
    assert bad_request(app_client, tenant.key, body)["param"] == param
