# Tenant limits at admission: one Lua script reserves a concurrency slot and prompt + max_tokens
# tokens for the request's priority (service/limit_reservations.py); over a limit → 429 with
# Retry-After and x-ratelimit-* headers. The reservation rides on the queued request, and whoever
# ends the request (the worker's finish, or the API when the enqueue itself fails) releases it.
from __future__ import annotations

import math

from metering.keys import Principal
from metering.ratelimit import PriorityLimit
from service import limit_reservations as rl
from service.context import AdmissionContext
from service.errors import APIError
from service.queued_request import QueuedRequest

REQUESTS_RETRY_S = 1  # over the concurrency limit: retry after this long


def duration(ms: int) -> str:
    """OpenAI's format for the x-ratelimit-reset-* headers: "0s", "250ms", "7.5s", "1m30s"."""
    ms = max(ms, 0)
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    minutes, rest_ms = divmod(ms, 60_000)
    seconds = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{minutes}m{seconds}" if minutes else seconds


def _headers(limit: PriorityLimit, d: rl.Decision, retry_s: int) -> dict[str, str]:
    headers: dict[str, str] = {}
    if limit.max_concurrency is not None:
        remaining = max(0, limit.max_concurrency - d.running)
        headers["x-ratelimit-limit-requests"] = str(limit.max_concurrency)
        headers["x-ratelimit-remaining-requests"] = str(remaining)
        # A slot frees when a running request ends, which nobody can know: while one is free,
        # now; else the retry interval.
        headers["x-ratelimit-reset-requests"] = duration(0 if remaining else retry_s * 1000)
    if limit.tokens_per_minute is not None:
        headers["x-ratelimit-limit-tokens"] = str(limit.tokens_per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(
            max(0, limit.tokens_per_minute - d.tokens_used)
        )
        headers["x-ratelimit-reset-tokens"] = duration(d.empty_ms)
    return headers


def reserved_tokens(queued: QueuedRequest) -> int:
    # every choice may run to max_tokens
    return len(queued.prompt_token_ids) + queued.sampling.max_tokens * queued.sampling.n


async def reserve(
    state: AdmissionContext, principal: Principal, queued: QueuedRequest
) -> dict[str, str]:
    """Admits or raises 429; on admission records the reservation on `queued`."""
    limit = principal.limit(queued.priority)
    tokens = reserved_tokens(queued)
    lease_s = state.settings.limit_lease_s
    raw = await state.redis.eval(
        *rl.reserve_call(
            queued.tenant_id, queued.priority, limit, queued.request_id, tokens, lease_s
        )
    )
    d = rl.decision(raw)
    headers = _headers(limit, d, REQUESTS_RETRY_S)
    if d.admitted:
        queued.reservation = rl.Reservation(d.window, tokens)
        return headers
    if d.exceeded == "tokens":
        tpm = limit.tokens_per_minute
        if tokens > (tpm or 0):
            message = (
                f"Request too large for the {queued.priority} priority: it needs {tokens} tokens "
                f"(prompt + max_tokens), the limit is {tpm} tokens per minute. "
                "Lower max_tokens or the prompt."
            )
        else:
            message = (
                f"Rate limit reached for the {queued.priority} priority: tokens per minute "
                f"(limit {tpm}, used {d.tokens_used}, requested {tokens})."
            )
        retry_after = math.ceil(d.reset_ms / 1000)
    else:
        message = (
            f"Rate limit reached for the {queued.priority} priority: concurrent requests "
            f"(limit {limit.max_concurrency}, running {d.running})."
        )
        retry_after = REQUESTS_RETRY_S
    headers["retry-after"] = str(max(1, retry_after))
    raise APIError(429, message, type=d.exceeded, code="rate_limit_exceeded", headers=headers)


async def release(state: AdmissionContext, queued: QueuedRequest, used_tokens: int = 0) -> None:
    if queued.reservation is not None:
        await state.redis.eval(
            *rl.release_call(
                queued.tenant_id,
                queued.priority,
                queued.request_id,
                queued.reservation,
                used_tokens,
            )
        )
