# POST /v1/completions (one prompt: a string or token ids)
from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import CurrentPrincipal, State
from api.generation import generate
from service.prepare import prepare_completion
from service.schemas.completions import CompletionFormatter, CompletionRequest

router = APIRouter(tags=["completions"])


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
        continuous_usage=body.continuous_usage,
        principal=principal,
    )
