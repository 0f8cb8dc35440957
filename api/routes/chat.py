# POST /v1/chat/completions
from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentPrincipal, State
from api.generation import generate
from api.openapi import GENERATION, errors, sse_and_json
from api.schemas.generation import ChatCompletion, ChatCompletionChunk
from api.strict_json import StrictJSONRoute
from service.prepare import chat_tool_mode, prepare_chat
from service.schemas.chat import ChatCompletionRequest, ChatFormatter

router = APIRouter(tags=["chat"], route_class=StrictJSONRoute)


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses=sse_and_json(ChatCompletion, ChatCompletionChunk) | errors(*GENERATION),
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: State, principal: CurrentPrincipal
) -> Response:
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    # Templating and tokenisation are CPU-bound: off the event loop, so /health and every other
    # request keep being served while a long prompt is prepared.
    queued = await run_in_threadpool(prepare_chat, state, body, principal, request_id)
    fmt = ChatFormatter(
        request_id, body.model, body.response_service_tier, chat_tool_mode(state, body)
    )
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
