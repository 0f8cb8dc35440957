# vLLM's request extras on a real `fleetlm serve` of the shipped chat model (greedy): they reach
# the engine and change the text as engine/sampling_params.py documents; per-chunk usage counts
# the tokens as the engine makes them; an extra the server cannot honour is a 400, not dropped.
from __future__ import annotations

from itertools import pairwise

import openai
import pytest

pytestmark = pytest.mark.timeout(120)

MODEL = "fleetlm-tiny-chat"
SPECIALS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")
# With ignore_eos the model ends its answer with <|im_end|> and goes on with the next turns.
GREEDY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Hello!"}],
    "max_tokens": 60,
    "temperature": 0,
}


def _text(server, **extra) -> tuple[str, int]:
    out = server.openai().chat.completions.create(
        **GREEDY, extra_body={"ignore_eos": True, **extra}
    )
    return out.choices[0].message.content, out.usage.completion_tokens


def test_skip_special_tokens_false_keeps_the_specials_in_the_text(shipped_server):
    skipped, n = _text(shipped_server)
    kept, n_kept = _text(shipped_server, skip_special_tokens=False)
    assert n == n_kept == 60  # the same tokens either way
    assert "<|im_end|>" in kept
    assert not any(s in skipped for s in SPECIALS)
    for s in SPECIALS:
        kept = kept.replace(s, "")
    assert kept == skipped


def test_include_stop_str_in_output_ends_the_text_with_the_stop_string(shipped_server):
    full, _ = _text(shipped_server)
    # A stop string of plain characters that first occurs some way into the text.
    at = next(
        i
        for i in range(10, len(full) - 3)
        if full[i : i + 3].isalnum() and full.index(full[i : i + 3]) == i
    )
    stop = full[at : at + 3]
    without, _ = _text(shipped_server, stop=[stop])
    with_stop, _ = _text(shipped_server, stop=[stop], include_stop_str_in_output=True)
    assert without == full[:at]
    assert with_stop == full[: at + 3]


def test_per_chunk_usage_counts_up_to_the_final_usage(shipped_server):
    chunks = list(
        shipped_server.openai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "count with me"}],
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
    )
    *content, trailer = chunks
    final = trailer.usage
    assert final.completion_tokens == 24 and not trailer.choices
    usages = [(c.usage.prompt_tokens, c.usage.completion_tokens) for c in content]
    assert all(p == final.prompt_tokens for p, _ in usages)
    assert all(b <= a for (_, b), (_, a) in pairwise(usages))
    assert content[-1].usage == final  # the chunk with the finish_reason
    assert content[-1].choices[0].finish_reason == "length"


def test_an_extra_the_server_cannot_honour_is_a_400(shipped_server):
    with pytest.raises(openai.BadRequestError) as exc:
        shipped_server.openai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"use_beam_search": True},  # (guided_choice is honoured since issue 38)
        )
    assert exc.value.body["param"] == "use_beam_search"
