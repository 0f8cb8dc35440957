# The queue message: one admitted request on fleetlm:q:{priority} (field "r", JSON), written by
# admission (the API or the batch runner) and read by a worker. Defined, encoded and decoded here.
# Its sampling is the engine's own SamplingParams (torch-free), validated where the request
# schema builds it and again where this decodes it; the worker hands it to the engine as it is.
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from engine.priority import Priority
from engine.sampling_params import SamplingParams
from service.limit_reservations import Reservation

Endpoint = Literal["chat.completions", "completions"]


@dataclass(slots=True)
class QueuedRequest:
    request_id: str
    tenant_id: str
    key_id: str
    model: str
    endpoint: Endpoint
    priority: Priority
    prompt_token_ids: list[int]
    sampling: SamplingParams  # max_tokens resolved (service/prepare.py): never None here
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
        """Raises InvalidSampling for a request whose sampling the engine refuses (it is still
        an admitted request: the worker fails it, billed), ValueError / TypeError / KeyError for
        an entry that is not a request."""
        fields: dict[str, Any] = json.loads(raw)
        sampling = fields.pop("sampling")
        fields["priority"] = Priority(fields["priority"])
        if fields.get("reservation") is not None:
            fields["reservation"] = Reservation(**fields["reservation"])
        request = cls(**fields, sampling=SamplingParams())
        try:
            request.sampling = SamplingParams(**sampling)
        except ValueError as exc:
            raise InvalidSampling(str(exc), request) from None
        return request


class InvalidSampling(ValueError):
    """A queue message whose sampling does not validate; `request` has default sampling."""

    def __init__(self, message: str, request: QueuedRequest) -> None:
        super().__init__(message)
        self.request = request
