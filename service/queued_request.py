# The queue message: one admitted request on fleetlm:q:{priority} (field "r", JSON), written by
# admission (the API or the batch runner) and read by a worker. Defined, encoded and decoded here.
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from engine.priority import Priority
from service.limit_reservations import Reservation

Endpoint = Literal["chat.completions", "completions"]


@dataclass(slots=True)
class Sampling:
    """The engine's SamplingParams fields a request sets (the worker passes them through)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16  # resolved at preparation: never None here
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # engine.sampling_params.StructuredOutput's fields ({"kind", "spec"}), or None
    structured_output: dict[str, str] | None = None
    logprobs: int | None = None  # top logprobs per sampled token (0: the token's own); None: off
    prompt_logprobs: int | None = None  # likewise for each prompt token (completions' echo)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: dict[int, float] | None = None  # (JSON keys: strings; SamplingParams converts)
    n: int = 1  # choices; their events carry an "index" (service/events.py)


@dataclass(slots=True)
class QueuedRequest:
    request_id: str
    tenant_id: str
    key_id: str
    model: str
    endpoint: Endpoint
    priority: Priority
    prompt_token_ids: list[int]
    sampling: Sampling
    enqueued_at: float  # wall clock (time.time()) at admission; the engine's arrival time
    batch_id: str | None = None
    reservation: Reservation | None = None  # on the tenant's limits; the request's end frees it
    # What admission added to the queue's token counter (streams.queued_tokens_key): the worker
    # that reads the entry takes the same amount off.
    queued_tokens: int = 0
    # The API process relaying it keeps its lease (streams.lease_key) while the client is
    # connected; the batch runner's requests have none.
    leased: bool = False

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str | bytes) -> QueuedRequest:
        fields: dict[str, Any] = json.loads(raw)
        fields["sampling"] = Sampling(**fields["sampling"])
        fields["priority"] = Priority(fields["priority"])
        if fields.get("reservation") is not None:
            fields["reservation"] = Reservation(**fields["reservation"])
        return cls(**fields)
