# Admits one batch line through the API's own code path: the request schemas, prepare_* (model
# and context checks, tokenisation), the tenant's BATCH class limits and the batch stream. Only
# the enqueue differs: it is idempotent per request id, so a pump that crashed after enqueueing
# but before committing re-admits nothing.
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.keys import Principal
from metering.models import TenantLimit
from metering.ratelimit import ClassLimit
from service import streams as p
from service.errors import APIError
from service.limits import release, reserve, reserved_tokens
from service.prepare import prepare_chat, prepare_completion
from service.schemas.chat import ChatCompletionRequest
from service.schemas.completions import CompletionRequest
from service.schemas.models import ModelCard
from service.settings import Settings

# KEYS: the queue, the request's marker. ARGV: queue limit, encoded request, marker TTL.
# Returns the entry id (the existing one when already enqueued), or false when the queue is full.
ENQUEUE_ONCE_SCRIPT = """
local done = redis.call('GET', KEYS[2])
if done then return done end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
local id = redis.call('XADD', KEYS[1], '*', 'r', ARGV[2])
redis.call('SET', KEYS[2], id, 'EX', tonumber(ARGV[3]))
return id
"""


def enqueued_key(request_id: str) -> str:
    return f"fleetlm:batch:enqueued:{request_id}"


@dataclass
class AdmissionState:
    """What prepare_* and service.limits read from the API's AppState."""

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


def load_principal(session: Session, tenant_id: uuid.UUID, key_id: uuid.UUID) -> Principal:
    limits = {
        lim.priority: ClassLimit(lim.max_concurrency, lim.tokens_per_minute)
        for lim in session.scalars(select(TenantLimit).where(TenantLimit.tenant_id == tenant_id))
    }
    return Principal(tenant_id, "", key_id, False, limits)


def _parse(endpoint: str, body: dict[str, Any]):
    body = {**body, "stream": False, "service_tier": "flex"}  # flex → the batch class
    body.pop("stream_options", None)
    schema = ChatCompletionRequest if endpoint == "/v1/chat/completions" else CompletionRequest
    return schema.model_validate(body)


def _rejected(exc: APIError) -> Rejected:
    return Rejected(exc.status, exc.body())


async def admit(
    state: AdmissionState,
    principal: Principal,
    endpoint: str,
    body: dict[str, Any],
    request_id: str,
    batch_id: str,
) -> Admitted | Rejected | Later:
    try:
        request = _parse(endpoint, body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        message = f"{loc}: {first.get('msg')}" if loc else str(first.get("msg"))
        return Rejected(400, APIError(400, message, param=loc or None).body())
    try:
        prepare = prepare_chat if endpoint == "/v1/chat/completions" else prepare_completion
        queued = prepare(state, request, principal, request_id)
    except APIError as exc:
        return _rejected(exc)
    queued.batch_id = batch_id
    queued.enqueued_at = time.time()
    tpm = principal.limit("batch").tokens_per_minute
    if tpm is not None and reserved_tokens(state, queued) > tpm:
        try:
            await reserve(state, principal, queued)  # raises the "too large" 429
        except APIError as exc:
            return _rejected(exc)
    try:
        await reserve(state, principal, queued)
    except APIError:
        return Later()
    entry_id = await state.redis.eval(
        ENQUEUE_ONCE_SCRIPT,
        2,
        p.queue_key("batch"),
        enqueued_key(request_id),
        state.settings.max_queue_len,
        queued.encode(),
        state.settings.batch_output_ttl_s,
    )
    if entry_id is None:
        await release(state, queued)
        return Later()
    return Admitted(entry_id if isinstance(entry_id, str) else entry_id.decode())
