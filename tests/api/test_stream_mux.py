# The API's one XREAD for every relayed output stream (api/stream_mux.py), on the embedded Redis.
from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid

import pytest
from redis.asyncio import Redis

from api.stream_mux import StreamMux
from service.redis_clients import UNREACHABLE


def _keys(n: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"test:mux:{run}:{i}" for i in range(n)]


def _run(coro):
    return asyncio.run(coro)


@contextlib.asynccontextmanager
async def _mux(url: str, keys: tuple[str, ...] | list[str] = (), **options):
    """A StreamMux on its own client; on the way out it stops, and the test's streams go."""
    redis = Redis.from_url(url, decode_responses=True)
    mux = StreamMux(redis, block_ms=5, **options)
    try:
        yield redis, mux
    finally:
        await mux.aclose()
        with contextlib.suppress(*UNREACHABLE):
            if keys:
                await redis.delete(*keys)
        await redis.aclose()


def test_each_stream_gets_its_own_entries_in_order_from_shared_reads(services):
    keys = _keys(40)

    async def scenario():
        async with _mux(services.redis_url, keys) as (redis, mux):
            subs = [mux.subscribe(k) for k in keys]
            for step in range(5):  # a worker step: one entry per stream, pipelined
                async with redis.pipeline(transaction=False) as pipe:
                    for i, key in enumerate(keys):
                        pipe.xadd(key, {"step": str(step), "stream": str(i)})
                    await pipe.execute()
            got: dict[int, list[str]] = {i: [] for i in range(len(keys))}
            for i, sub in enumerate(subs):
                while len(got[i]) < 5:
                    response = await sub.read(5.0)
                    assert response, f"stream {i} timed out with {got[i]}"
                    ((key, entries),) = response
                    assert key == keys[i]
                    for _, fields in entries:
                        assert fields["stream"] == str(i)
                        got[i].append(fields["step"])
            assert all(steps == ["0", "1", "2", "3", "4"] for steps in got.values())
            # 200 entries in 40 streams, far fewer reads than one per entry
            assert mux.num_reads < 100

    _run(scenario())


def test_a_quiet_stream_times_out_empty_and_a_late_entry_still_arrives(services):
    (key,) = _keys(1)

    async def scenario():
        async with _mux(services.redis_url, [key]) as (redis, mux):
            sub = mux.subscribe(key)
            assert await sub.read(0.05) == []
            reader = asyncio.ensure_future(sub.read(5.0))
            await asyncio.sleep(0.02)
            await redis.xadd(key, {"n": "1"})
            ((_, entries),) = await reader
            assert [f["n"] for _, f in entries] == ["1"]

    _run(scenario())


def test_unsubscribed_streams_leave_the_read_and_may_be_subscribed_again(services):
    (key,) = _keys(1)

    async def scenario():
        async with _mux(services.redis_url, [key]) as (redis, mux):
            sub = mux.subscribe(key)
            with pytest.raises(ValueError):
                mux.subscribe(key)  # one reader per stream per process
            await redis.xadd(key, {"n": "1"})
            assert (await sub.read(5.0))[0][1][0][1] == {"n": "1"}
            mux.unsubscribe(sub)
            await redis.xadd(key, {"n": "2"})
            again = mux.subscribe(key)  # from the start of the stream
            seen = []
            while len(seen) < 2:
                response = await again.read(5.0)
                assert response
                seen += [f["n"] for _, f in response[0][1]]
            assert seen == ["1", "2"]
            assert sub.entries == type(sub.entries)()  # the old one got nothing more

    _run(scenario())


def test_a_redis_that_does_not_answer_reaches_the_pending_read():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def scenario():
        async with _mux(f"redis://127.0.0.1:{port}/0", retry_s=0.05) as (_, mux):
            sub = mux.subscribe("test:mux:nobody")
            with pytest.raises(UNREACHABLE):
                await sub.read(5.0)

    _run(scenario())
