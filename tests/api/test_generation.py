# A generation request through the API in process: admission puts the prepared request on its
# priority's queue (tokens, typed sampling, the limits' reservation), the relay turns the
# worker's events into a response or SSE chunks, errors keep the OpenAI shape, and a client
# that goes away publishes a cancel. The test plays the worker over the wire.
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine.sampling_params import SamplingParams
from service import streams as p
from service.events import error_event
from tests.api.conftest import SETTINGS, sdk
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

PROMPT = list(range(1, 11))


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as executor:
        yield executor


def test_admission_enqueues_the_prepared_request_and_the_reply_is_relayed(
    app_client, tenant, worker, pool
):
    client = sdk(app_client, tenant.key)
    reply = pool.submit(
        client.chat.completions.with_raw_response.create,
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0,
        stop=["x"],
        service_tier="flex",
    )
    queued = worker.take(tenant, "batch")  # service_tier flex → the batch priority
    assert queued.request_id.startswith("chatcmpl-") and queued.endpoint == "chat.completions"
    assert queued.model == "tiny" and queued.tenant_id == str(tenant.id)
    assert queued.sampling == SamplingParams(temperature=0.0, max_tokens=5, stop=["x"])
    num_prompt = len(queued.prompt_token_ids)
    assert num_prompt > 0
    assert queued.reservation is not None and queued.reservation.tokens == num_prompt + 5
    assert abs(queued.enqueued_at - time.time()) < 30
    worker.publish(
        queued.request_id,
        worker.delta("Hel", 1),
        worker.delta("lo", 3),
        worker.done("!", num_prompt, 5),
    )
    raw = reply.result(timeout=30)
    assert raw.headers["x-request-id"] == queued.request_id
    out = raw.parse()
    assert out.id == queued.request_id and out.service_tier == "flex"
    assert out.choices[0].message.content == "Hello!"
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (num_prompt, 5)
    assert out.usage.total_tokens == num_prompt + 5


def test_max_tokens_left_out_is_resolved_once_to_the_rest_of_the_context(
    app_client, tenant, worker, pool
):
    # The queued request carries the integer: the reservation, the queue's token count and the
    # engine read it, none of them re-derives "None: the rest of the context".
    client = sdk(app_client, tenant.key)
    reply = pool.submit(client.completions.create, model="tiny", prompt=PROMPT, max_tokens=None)
    queued = worker.take(tenant)
    room = SETTINGS.resolved_max_model_len() - len(PROMPT)
    assert queued.sampling.max_tokens == room
    assert queued.reservation is not None and queued.reservation.tokens == len(PROMPT) + room
    worker.publish(queued.request_id, worker.done("ok", len(PROMPT), 1))
    assert reply.result(timeout=30).choices[0].text == "ok"


def test_stream_relays_events_as_chunks_with_usage(app_client, tenant, worker, pool):
    client = sdk(app_client, tenant.key)

    def stream() -> list:
        chunks = client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        return list(chunks)

    chunks = pool.submit(stream)
    queued = worker.take(tenant)
    assert queued.prompt_token_ids == PROMPT and queued.priority == "interactive"
    worker.publish(queued.request_id, worker.delta("a", 1), worker.delta("", 2))
    worker.publish(queued.request_id, worker.delta("b", 3), worker.done("c", 10, 4))
    got = chunks.result(timeout=30)
    assert [c.choices[0].text for c in got[:-1]] == ["a", "b", "c"]  # empty deltas are skipped
    assert [c.choices[0].finish_reason for c in got[:-1]] == [None, None, "length"]
    assert got[-1].choices == [] and got[-1].usage.completion_tokens == 4
    assert got[-1].usage.total_tokens == 14


def test_an_error_after_streaming_began_is_an_sse_error(app_client, tenant, worker, pool):
    client = sdk(app_client, tenant.key)
    received: list[str] = []

    def stream() -> None:
        chunks = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, stream=True)
        for chunk in chunks:
            received.append(chunk.choices[0].text)

    result = pool.submit(stream)
    queued = worker.take(tenant)
    failed = error_event("the engine failed", "engine_error") | {"worker": worker.id}
    worker.publish(queued.request_id, worker.delta("partial", 1), failed)
    with pytest.raises(openai.APIError) as exc:
        result.result(timeout=30)
    assert "the engine failed" in str(exc.value.message)
    assert received == ["partial"]


def test_a_worker_that_dies_mid_request_is_a_503(app_client, tenant, worker, pool):
    reply = pool.submit(
        app_client.post,
        "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": 20},
        headers={"Authorization": f"Bearer {tenant.key}"},
    )
    queued = worker.take(tenant)
    worker.publish(queued.request_id, worker.delta("x", 1))
    worker.die()  # its heartbeat key is gone: the relay notices within relay_poll_s
    r = reply.result(timeout=30)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "worker_lost"
    assert r.json()["error"]["type"] == "server_error"


def test_with_no_live_worker_a_queued_request_fails_and_is_cancelled(app_client, tenant, rds):
    assert not [w for w in rds.smembers(p.WORKERS_SET) if rds.exists(p.alive_key(w))]
    started = time.monotonic()
    r = app_client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2},
        headers={"Authorization": f"Bearer {tenant.key}"},
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_workers"
    assert time.monotonic() - started < SETTINGS.no_worker_timeout_s + 10
    # still queued: whichever worker picks it up later drops it (the client got no token)
    assert rds.get(p.cancel_key(r.headers["x-request-id"])) == "n=0"
    rds.delete(p.queue_key("interactive"))


def test_a_client_that_goes_away_publishes_a_cancel(app_client, tenant, worker, rds):
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 50, "stream": True}
    headers = {"Authorization": f"Bearer {tenant.key}"}
    with app_client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        request_id = r.headers["x-request-id"]
        worker.take(tenant)
        worker.publish(request_id, worker.delta("one", 1))
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        assert rds.get(p.cancel_key(request_id)) is None
    # the response was closed before its end: the relay is cancelled and publishes the cancel,
    # with the tokens the client received (what the request is billed)
    wait_until(lambda: rds.get(p.cancel_key(request_id)) == "n=1", 10, "the cancel key")
