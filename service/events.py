# Output events: one JSON object in field "e" of each fleetlm:out:{request_id} entry, written by
# the worker (and, for liveness errors, by the relay) and read by the API's relay and the batch
# runner. "done" and "error" are final: a reader stops there. Defined, encoded and decoded here.
from __future__ import annotations

import json
from typing import Literal, NotRequired, TypedDict

from metering.records import UsageCounts

FINAL_EVENTS = ("done", "error")


class DeltaEvent(TypedDict):
    type: Literal["delta"]
    text: str
    worker: str
    completion_tokens: int  # so far: what a reclaiming worker bills if this worker dies
    cached_tokens: NotRequired[int]  # of the prompt, once scheduled (per-chunk usage)


class DoneEvent(TypedDict):
    type: Literal["done"]
    text: str
    worker: str
    finish_reason: Literal["stop", "length"]
    usage: UsageCounts


class ErrorEvent(TypedDict):
    type: Literal["error"]
    message: str
    code: str  # cancelled | invalid_request | engine_error | worker_lost | no_workers
    text: NotRequired[str]  # the last text the engine produced before it ended
    worker: NotRequired[str | None]  # absent when the relay itself gave up
    usage: NotRequired[UsageCounts]


Event = DeltaEvent | DoneEvent | ErrorEvent


def error_event(message: str, code: str) -> ErrorEvent:
    return {"type": "error", "message": message, "code": code}


def encode_event(event: Event) -> dict[str, str]:
    return {"e": json.dumps(event, separators=(",", ":"))}


def decode_event(fields: dict) -> Event:
    raw = fields.get("e", fields.get(b"e"))
    return json.loads(raw)
