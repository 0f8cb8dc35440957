# The delta event's hand-formatted JSON (workers/gpu/output_events.py) is the same bytes json.dumps
# writes for the event dict, for every kind of text a tokenizer can produce, and with or without
# the first event's cached tokens.
from __future__ import annotations

import json

import pytest

from engine.outputs import RequestDelta, RequestUsage
from service.events import decode_event, encode_event
from tests.wire import queued_request
from workers.gpu.inflight import Inflight
from workers.gpu.output_events import delta_event, delta_event_json

TEXTS = [
    "",
    " word",
    'a "quoted" \\ back\\slash',
    "line\nbreak\ttab\r\x00\x1f",
    "héllo wörld — ünïcödé",
    "emoji 🙂 and CJK 漢字",
    "\ud83d",  # a lone surrogate: a byte-level tokenizer can split a character
    "</script><!--",
]


@pytest.mark.parametrize("published", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_delta_json_is_what_json_dumps_writes(text: str, published: bool):
    f = Inflight(queued_request(), "fleetlm:q:interactive", "1-0", published=published)
    usage = RequestUsage(prompt_tokens=40, cached_tokens=32, completion_tokens=7, preemptions=0)
    delta = RequestDelta(
        f.request_id, [5, 0, 128000], text, False, None, None, usage, 0.0, 0.0, 0.0, None
    )
    fast = delta_event_json('vm-1-ab"cd', f, delta)
    assert fast == encode_event(delta_event('vm-1-ab"cd', f, delta))["e"]
    event = decode_event({"e": fast})
    assert event["text"] == text and event["token_ids"] == [5, 0, 128000]
    assert ("cached_tokens" in event) is not published
    json.loads(fast)
