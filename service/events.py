# Output events: one JSON object in field "e" of each fleetlm:out:{request_id} entry, written by
# the workers and read by the API's relay and the batch runner (through service/output_stream.py,
# which applies the stream's rules: a resume hands the stream to another worker, and a token
# position is delivered once). "done" and "error" are final: a reader stops there. Defined,
# encoded and decoded here.
from __future__ import annotations

import json
from typing import Literal, NotRequired, TypedDict

FINAL_EVENTS = ("done", "error")
# A request's usage record as its final event carries it: engine.usage.RequestUsage.to_json()
# (the counters by name), read back with RequestUsage.from_json.
UsageJSON = dict[str, int]


class DeltaEvent(TypedDict):
    type: Literal["delta"]
    text: str
    worker: str
    completion_tokens: int  # so far, this event's included: the position a reader has reached
    token_ids: list[int]  # this event's tokens: what another worker re-runs if this one dies
    # Of the prompt, once scheduled (per-chunk usage; a resuming worker bills the first run's).
    cached_tokens: NotRequired[int]
    # When the request asked: per token {"token", "logprob", "bytes", "top_logprobs"} (OpenAI's
    # chat shape, workers/gpu/output_events.py)
    logprobs: NotRequired[list[dict]]
    # With the first event of a request that asked: per prompt token after the first, likewise
    prompt_logprobs: NotRequired[list[dict]]
    # n > 1: the choice of these tokens (completion_tokens counts every choice's), and the
    # choice's finish_reason on the delta that ends it while others go on
    index: NotRequired[int]
    finish_reason: NotRequired[str]


class ResumeEvent(TypedDict):
    """A worker took the request over from one that stopped (service/output_stream.py): from
    here on only its events count; it continues after the tokens delivered before this event."""

    type: Literal["resume"]
    worker: str


class DoneEvent(TypedDict):
    type: Literal["done"]
    text: str
    worker: str
    finish_reason: Literal["stop", "length"]
    usage: UsageJSON
    logprobs: NotRequired[list[dict]]  # the last tokens' (as DeltaEvent's)
    prompt_logprobs: NotRequired[list[dict]]  # when no delta came before (max_tokens 0)
    # n > 1: the choice of `text` and `logprobs`, and every choice's finish reason (a choice
    # whose ending delta a reader skipped as a duplicate ends here)
    index: NotRequired[int]
    finish_reasons: NotRequired[list[str]]


class ErrorEvent(TypedDict):
    type: Literal["error"]
    message: str
    # cancelled | invalid_request | engine_error | worker_lost | no_workers | shutdown |
    # redis_unavailable
    code: str
    text: NotRequired[str]  # the last text the engine produced before it ended
    worker: NotRequired[str | None]  # absent when the relay itself gave up
    usage: NotRequired[UsageJSON]


Event = DeltaEvent | ResumeEvent | DoneEvent | ErrorEvent


def error_event(message: str, code: str) -> ErrorEvent:
    return {"type": "error", "message": message, "code": code}


def encode_event(event: Event) -> dict[str, str]:
    return {"e": json.dumps(event, separators=(",", ":"))}


def decode_event(fields: dict) -> Event:
    raw = fields.get("e", fields.get(b"e"))
    return json.loads(raw)
