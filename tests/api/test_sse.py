# The per-request chunk template (api/sse.py) encodes a content chunk exactly as the generic path
# does, for both endpoints' shapes and awkward texts.
from __future__ import annotations

import json

import pytest

from api.sse import ChunkTemplate, sse
from service.schemas.chat import ChatFormatter
from service.schemas.completions import CompletionFormatter

TEXTS = ["", "a", " hello", 'quote " and \\ backslash', "line\nbreak\t", "é中文🙂", "\x00", "</s>"]
FORMATTERS = [
    CompletionFormatter("cmpl-1", "tiny"),
    ChatFormatter("chatcmpl-1", 'model "with" quotes', "flex"),
]


@pytest.mark.parametrize("fmt", FORMATTERS, ids=["completions", "chat"])
@pytest.mark.parametrize("usage_field", [{}, {"usage": None}], ids=["no-usage", "usage-null"])
def test_template_matches_generic_encoding(fmt, usage_field):
    template = ChunkTemplate(lambda text: fmt.chunk(text, None) | usage_field)
    for text in TEXTS:
        event = template.event(text)
        assert event == sse(fmt.chunk(text, None) | usage_field)
        assert event.startswith("data: ") and event.endswith("\n\n")
        body = json.loads(event[len("data: ") :])
        content = body["choices"][0].get("text", body["choices"][0].get("delta", {}).get("content"))
        assert content == text


def test_template_needs_the_text_once():
    fmt = CompletionFormatter("cmpl-1", "tiny")
    with pytest.raises(ValueError):
        ChunkTemplate(lambda text: fmt.chunk("no text", None))
    with pytest.raises(ValueError):
        ChunkTemplate(lambda text: fmt.chunk(text, None) | {"x": text})
