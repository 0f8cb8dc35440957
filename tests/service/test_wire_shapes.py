# The wire shapes, each defined and coded in one module: the queue message
# (service/queued_request.py), the output events (service/events.py), the metering records
# (metering/records.py), and the usage a response reports (service/schemas/sampling.py).
from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from engine.priority import Priority
from engine.sampling_params import SamplingParams, StructuredOutput
from engine.usage import RequestUsage
from metering.records import BusyRecord, RequestRecord, decode_record, encode_record
from service.events import decode_event, encode_event, error_event
from service.limit_reservations import Reservation
from service.queued_request import InvalidSampling, QueuedRequest
from service.schemas.usage import Usage


def test_the_queue_message_round_trips_typed():
    queued = QueuedRequest(
        request_id="cmpl-1",
        tenant_id=str(uuid.uuid4()),
        key_id=str(uuid.uuid4()),
        model="tiny",
        endpoint="completions",
        priority="batch",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingParams(
            temperature=0.0,
            max_tokens=5,
            stop=["\n"],
            seed=7,
            structured_output=StructuredOutput("regex", "a+"),
            logit_bias={42: 1.5},  # int keys: strings in JSON, ints again once decoded
        ),
        enqueued_at=time.time(),
        batch_id="batch_1",
        reservation=Reservation(window=123, tokens=8),
    )
    decoded = QueuedRequest.decode(queued.encode())
    assert decoded == queued
    assert isinstance(decoded.sampling, SamplingParams) and decoded.priority is Priority.BATCH
    assert isinstance(decoded.reservation, Reservation)
    plain = QueuedRequest.decode(replace(queued, reservation=None, batch_id=None).encode())
    assert plain.reservation is None and plain.batch_id is None


def test_a_message_whose_sampling_the_engine_refuses_still_decodes_its_request():
    # Admitted (billed, maybe awaited): the worker fails it rather than dropping it.
    queued = QueuedRequest(
        "cmpl-2", "t", "k", "tiny", "completions", Priority.INTERACTIVE, [1], SamplingParams(), 0.0
    )
    raw = json.loads(queued.encode())
    raw["sampling"]["temperature"] = -1.0
    with pytest.raises(InvalidSampling, match="temperature") as exc:
        QueuedRequest.decode(json.dumps(raw))
    assert exc.value.request.request_id == "cmpl-2"


def test_events_round_trip():
    event = error_event("request cancelled", "cancelled") | {"worker": "w1", "text": "ab"}
    assert decode_event(encode_event(event)) == event
    raw = {k.encode(): v.encode() for k, v in encode_event(event).items()}
    assert decode_event(raw) == event  # a client without decode_responses


def test_a_request_record_round_trips_and_becomes_its_row():
    now = time.time()
    record = RequestRecord(
        request_id="cmpl-1", tenant_id=str(uuid.uuid4()), key_id=None, model="tiny",
        priority="interactive", endpoint="completions", batch_id=None, status="cancelled",
        finish_reason="abort", error="request cancelled",
        counts=RequestUsage(prompt_tokens=9, completion_tokens=2).to_json(),
        queue_ms=1.25, ttft_ms=None, tpot_ms=None, e2e_ms=40.0, worker_id="w1",
        enqueued_at=now - 0.04, finished_at=now,
    )  # fmt: skip
    fields = encode_record(record)
    assert all(isinstance(v, str) for v in fields.values())  # stream fields
    assert decode_record(fields) == record
    row = decode_record(fields).row()
    assert row["created_at"] == datetime.fromtimestamp(now - 0.04, UTC)
    assert row["finished_at"].tzinfo is UTC and row["key_id"] is None
    assert (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]) == (9, 2, 0)
    assert row["ttft_ms"] is None and row["tenant_id"] == uuid.UUID(record.tenant_id)
    busy = BusyRecord(worker_id="w1", interval_start=120, interval_s=60, busy_ms=5, num_steps=2)
    assert decode_record(encode_record(busy)) == busy


@pytest.mark.parametrize(
    "fields",
    [{"request_id": "x"}, {"kind": "request", "r": "{"}, {"kind": "request", "r": "{}"}],
)
def test_a_malformed_record_raises(fields):
    with pytest.raises((KeyError, ValueError, TypeError)):
        decode_record(fields)


def test_usage_details_report_accepted_and_rejected_drafts():
    usage = Usage.of(
        RequestUsage(**{"prompt_tokens": 20, "cached_tokens": 16, "completion_tokens": 12,
                      "spec_proposed_tokens": 10, "spec_accepted_tokens": 7})
    )  # fmt: skip
    details = usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (7, 3)
    assert usage.total_tokens == 32 and usage.prompt_tokens_details.cached_tokens == 16
    plain = Usage.of(RequestUsage(prompt_tokens=3, completion_tokens=2))
    assert plain.completion_tokens_details.accepted_prediction_tokens == 0
    assert plain.completion_tokens_details.rejected_prediction_tokens == 0
