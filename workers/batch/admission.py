# Admits one batch line through the API's own code path (service/): the request schemas,
# preparation (model and context checks, tokenisation), the tenant's batch-priority limits and
# the batch stream. Only the enqueue differs: it is idempotent per request id, so a pump that
# crashed after enqueueing but before committing re-admits nothing.
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from engine.priority import Priority
from metering.keys import Principal
from service.admission import enqueue_once, queued_tokens
from service.errors import APIError, validation_error
from service.limits import release, reserve, reserved_tokens
from service.prepare import prepare_chat, prepare_completion
from service.schemas.chat import ChatCompletionRequest
from service.schemas.completions import CompletionRequest
from service.schemas.models import ModelCard
from service.schemas.sampling import priority_tier
from service.settings import Settings


@dataclass
class BatchAdmissionContext:
    """What preparation and limits read (service.context.AdmissionContext)."""

    settings: Settings
    redis: Redis
    tokenizer: Any
    model_card: ModelCard


@dataclass(frozen=True, slots=True)
class Admitted:
    entry_id: str


@dataclass(frozen=True, slots=True)
class Rejected:
    status_code: int
    error: dict[str, Any]  # the OpenAI error body


class Later:  # back-pressure: limits or the queue are full; retry on a later pump
    pass


def _parse(endpoint: str, body: dict[str, Any]):
    # Every line runs at the batch priority, whatever service_tier it names.
    body = {**body, "stream": False, "service_tier": priority_tier(Priority.BATCH)}
    body.pop("stream_options", None)
    schema = ChatCompletionRequest if endpoint == "/v1/chat/completions" else CompletionRequest
    return schema.model_validate(body)


def _rejected(exc: APIError) -> Rejected:
    return Rejected(exc.status, exc.body())


async def admit(
    context: BatchAdmissionContext,
    principal: Principal,
    endpoint: str,
    body: dict[str, Any],
    request_id: str,
    batch_id: str,
) -> Admitted | Rejected | Later:
    try:
        request = _parse(endpoint, body)
    except ValidationError as exc:
        return _rejected(validation_error(exc.errors()))
    try:
        prepare = prepare_chat if endpoint == "/v1/chat/completions" else prepare_completion
        queued = prepare(context, request, principal, request_id)
    except APIError as exc:
        return _rejected(exc)
    queued.batch_id = batch_id
    queued.enqueued_at = time.time()
    queued.queued_tokens = queued_tokens(queued, None)
    tpm = principal.limit(Priority.BATCH).tokens_per_minute
    if tpm is not None and reserved_tokens(queued) > tpm:
        try:
            await reserve(context, principal, queued)  # raises the "too large" 429
        except APIError as exc:
            return _rejected(exc)
    try:
        await reserve(context, principal, queued)
    except APIError:
        return Later()
    entry_id = await enqueue_once(context, queued)
    if entry_id is None:
        await release(context, queued)
        return Later()
    return Admitted(entry_id)
