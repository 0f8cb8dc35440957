# Admission: the model check, the context check and the enqueue (atomic against the queue limit).
# Tokenisation and the chat template run here, so prompt tokens are known before queueing.
from __future__ import annotations

import time

from redis.asyncio import Redis

from api.errors import APIError, invalid_param
from api.schemas.sampling import SamplingRequest
from api.state import AppState
from metering.keys import Principal
from workers import protocol as p


def check_model(state: AppState, model: str) -> None:
    if model != state.model_card.id:
        raise APIError(
            404,
            f"The model `{model}` does not exist; this server serves `{state.model_card.id}`.",
            param="model",
            code="model_not_found",
        )


def check_context(state: AppState, num_prompt: int, max_tokens: int | None, param: str) -> None:
    limit = state.model_card.max_model_len
    wanted = num_prompt + (max_tokens or 1)
    if wanted > limit:
        raise invalid_param(
            param,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{wanted} tokens ({num_prompt} in the prompt, {max_tokens or 1} for the completion). "
            "Please reduce the prompt or the completion length.",
            code="context_length_exceeded",
        )


def build_request(
    request_id: str,
    body: SamplingRequest,
    principal: Principal,
    endpoint: str,
    prompt_token_ids: list[int],
) -> p.QueuedRequest:
    return p.QueuedRequest(
        request_id=request_id,
        tenant_id=str(principal.tenant_id),
        key_id=str(principal.key_id),
        model=body.model,
        endpoint=endpoint,
        priority=body.priority,
        prompt_token_ids=prompt_token_ids,
        sampling=body.sampling_params(),
        enqueued_at=time.time(),
    )


async def enqueue(redis: Redis, state: AppState, queued: p.QueuedRequest) -> None:
    settings = state.settings
    added = await redis.eval(
        p.ENQUEUE_SCRIPT,
        1,
        p.queue_key(queued.priority),
        settings.max_queue_len,
        queued.encode(),
    )
    if added is None:
        raise APIError(
            503,
            f"The {queued.priority} queue is full ({settings.max_queue_len} requests); "
            "retry shortly.",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": str(settings.queue_retry_after_s)},
        )


async def publish_cancel(redis: Redis, state: AppState, request_id: str) -> None:
    await redis.set(p.cancel_key(request_id), "1", ex=state.settings.output_ttl_s)
