# The usage a stream reports: with vLLM's stream_options.continuous_usage_stats every chunk carries
# the usage so far, non-decreasing, and the chunk with the finish_reason carries the final usage,
# the same as the trailing usage chunk of include_usage. The test plays the worker.
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import pytest

from tests.api.conftest import sdk

pytestmark = pytest.mark.timeout(60)


def _counts(usage) -> tuple[int, int, int, int]:
    cached = usage.prompt_tokens_details.cached_tokens
    return usage.prompt_tokens, cached, usage.completion_tokens, usage.total_tokens


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_is_cumulative_and_ends_at_the_final_usage(
    app_client, tenant, worker, endpoint
):
    client = sdk(app_client, tenant.key)
    options = {"include_usage": True, "continuous_usage_stats": True}
    if endpoint == "chat":
        create = client.chat.completions.create
        kwargs = {"messages": [{"role": "user", "content": "hi"}]}
    else:
        create = client.completions.create
        kwargs = {"prompt": "hi"}
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            lambda: list(
                create(model="tiny", max_tokens=6, stream=True, stream_options=options, **kwargs)
            )
        )
        queued = worker.take(tenant)
        num_prompt = len(queued.prompt_token_ids)
        cached = {"cached_tokens": 16}  # known once the worker has scheduled the prompt
        worker.publish(
            queued.request_id,
            worker.delta("a", 1) | cached,
            worker.delta("", 2) | cached,  # no text: no chunk
            worker.delta("b", 4) | cached,
        )
        done = worker.done("c", num_prompt, 6)
        done["usage"]["cached_tokens"] = 16
        worker.publish(queued.request_id, done)
        chunks = reply.result(timeout=30)

    *content, trailer = chunks
    assert trailer.choices == [] and trailer.usage is not None
    final = _counts(trailer.usage)
    assert final == (num_prompt, 16, 6, num_prompt + 6)
    seen = [_counts(c.usage) for c in content]
    assert seen[-1] == final  # the chunk with the finish_reason
    assert content[-1].choices[0].finish_reason == "length"
    for before, after in pairwise(seen):
        assert all(a >= b for a, b in zip(after, before)), seen
    completions = [s[2] for s in seen]
    assert completions[-3:] == [1, 4, 6]
    assert all(s[0] == num_prompt and s[3] == s[0] + s[2] for s in seen)


def _two_token_stream(app_client, tenant, worker, options: dict) -> list:
    """A streamed completion the played worker answers with one delta, then the end."""
    client = sdk(app_client, tenant.key)
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(
            lambda: list(
                client.completions.create(
                    model="tiny", prompt="hi", max_tokens=2, stream=True, stream_options=options
                )
            )
        )
        queued = worker.take(tenant)
        worker.publish(
            queued.request_id,
            worker.delta("a", 1),
            worker.done("b", len(queued.prompt_token_ids), 2),
        )
        return reply.result(timeout=30)


def test_without_continuous_usage_content_chunks_carry_null_usage(app_client, tenant, worker):
    *content, trailer = _two_token_stream(app_client, tenant, worker, {"include_usage": True})
    assert [c.usage for c in content] == [None, None]
    assert trailer.usage.completion_tokens == 2


def test_continuous_usage_alone_needs_no_trailing_chunk(app_client, tenant, worker):
    chunks = _two_token_stream(app_client, tenant, worker, {"continuous_usage_stats": True})
    assert [c.usage.completion_tokens for c in chunks] == [1, 2]
    assert all(c.choices for c in chunks)
