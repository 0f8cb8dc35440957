# The enqueue at the end of admission, on the embedded Redis: the queue limit is atomic (a full
# queue is a 503 with Retry-After), and the batch runner's variant enqueues a request id once.
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from service import streams as p
from service.admission import enqueue, enqueue_once
from service.errors import APIError
from service.limits import duration
from service.queued_request import QueuedRequest
from service.schemas.models import ModelCard
from service.settings import Settings
from tests.wire import queued_request


@dataclass
class Context:  # service.context.AdmissionContext
    settings: Settings
    redis: Redis
    tokenizer: object = None
    model_card: ModelCard = field(
        default_factory=lambda: ModelCard(id="tiny", created=0, max_model_len=4096)
    )


def queued() -> QueuedRequest:
    return queued_request(priority="batch")


def run(services, max_queue_len: int, check) -> None:
    async def main() -> None:
        redis = Redis.from_url(services.redis_url, decode_responses=True)
        settings = Settings(_env_file=None, max_queue_len=max_queue_len, queue_retry_after_s=3)
        await redis.delete(p.queue_key("batch"))
        try:
            await check(Context(settings, redis), redis)
        finally:
            await redis.delete(p.queue_key("batch"))
            await redis.aclose()

    asyncio.run(main())


def test_a_full_queue_refuses_with_503_and_retry_after(services):
    async def check(context: Context, redis: Redis) -> None:
        await enqueue(redis, context, queued())
        await enqueue(redis, context, queued())
        with pytest.raises(APIError) as exc:
            await enqueue(redis, context, queued())
        assert exc.value.status == 503 and exc.value.code == "queue_full"
        assert exc.value.headers == {"Retry-After": "3"}
        assert await redis.xlen(p.queue_key("batch")) == 2

    run(services, 2, check)


def test_enqueue_once_is_idempotent_per_request_id(services):
    async def check(context: Context, redis: Redis) -> None:
        request = queued()
        first = await enqueue_once(context, request)
        assert first is not None
        assert await enqueue_once(context, request) == first  # a re-run pump: the same entry
        assert await redis.xlen(p.queue_key("batch")) == 1
        assert await enqueue_once(context, queued()) is None  # full: back-pressure, no error

    run(services, 1, check)


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (-5, "0s"), (250, "250ms"), (1000, "1s"), (7500, "7.5s"), (90_000, "1m30s"),
     (61_001, "1m1.001s"), (120_000, "2m0s")],
)  # fmt: skip
def test_reset_durations_in_openai_format(ms, text):
    assert duration(ms) == text
