# POST /v1/completions (one prompt: a string or token ids)
from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import CurrentPrincipal, State
from api.generation import Formatter, created_now, generate
from api.prepare import prepare_completion
from api.schemas.completions import CompletionRequest
from api.schemas.sampling import Usage

router = APIRouter(tags=["completions"])


class CompletionFormatter(Formatter):
    def __init__(self, request_id: str, model: str) -> None:
        self.base = {
            "id": request_id,
            "object": "text_completion",
            "created": created_now(),
            "model": model,
            "system_fingerprint": None,
        }

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self.base | {"choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.base | {"choices": [], "usage": usage.model_dump()}

    def response(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return self.chunk(text, finish_reason) | {"usage": usage.model_dump()}


@router.post("/v1/completions")
async def create_completion(
    body: CompletionRequest, request: Request, state: State, principal: CurrentPrincipal
) -> Response:
    request_id = f"cmpl-{uuid.uuid4().hex}"
    queued = prepare_completion(state, body, principal, request_id)
    fmt = CompletionFormatter(request_id, body.model)
    return await generate(
        request,
        state,
        queued,
        fmt,
        stream=body.stream,
        include_usage=body.include_usage,
        principal=principal,
    )
