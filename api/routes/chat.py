# POST /v1/chat/completions
from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import CurrentPrincipal, State
from api.generation import generate
from service.prepare import prepare_chat
from service.schemas.chat import ChatCompletionRequest, ChatFormatter

router = APIRouter(tags=["chat"])


@router.post("/v1/chat/completions")
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: State, principal: CurrentPrincipal
) -> Response:
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    queued = prepare_chat(state, body, principal, request_id)
    fmt = ChatFormatter(request_id, body.model, body.response_service_tier)
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
