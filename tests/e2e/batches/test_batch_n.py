# A batch line with n = 2 comes back with two choices, each its own index, and bills the prompt
# once and both choices' tokens, in the output line and in the one metering row.
from __future__ import annotations

import pytest

from tests.e2e.batches.conftest import chat_line, read_lines, submit, wait_batch

pytestmark = pytest.mark.timeout(300)


def test_a_line_with_n_two(server):
    client = server.openai()
    lines = [
        chat_line("two", max_tokens=5, n=2, seed=4, temperature=1.0, ignore_eos=True),
        chat_line("one", max_tokens=5, seed=4, temperature=1.0, ignore_eos=True),
    ]
    batch = wait_batch(client, submit(client, lines).id, timeout_s=200)
    assert batch.status == "completed", batch
    out = {x["custom_id"]: x["response"] for x in read_lines(client, batch.output_file_id)}
    two, one = out["two"]["body"], out["one"]["body"]
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert all(c["finish_reason"] == "length" for c in two["choices"])
    assert two["choices"][0]["message"]["content"] == one["choices"][0]["message"]["content"]
    assert two["usage"]["completion_tokens"] == 10
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    (row,) = server.usage_rows([two["id"]])
    assert (row.prompt_tokens, row.completion_tokens) == (two["usage"]["prompt_tokens"], 10)
