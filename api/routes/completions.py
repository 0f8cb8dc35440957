# POST /v1/completions (one prompt: a string or token ids)
from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.deps import CurrentPrincipal, State
from api.generation import generate
from api.openapi import GENERATION, errors, sse_and_json
from api.schemas.generation import TextCompletion
from api.strict_json import StrictJSONRoute
from service.prepare import completion_echo, prepare_completion
from service.schemas.completions import CompletionFormatter, CompletionRequest

router = APIRouter(tags=["completions"], route_class=StrictJSONRoute)


@router.post(
    "/v1/completions",
    response_model=None,
    responses=sse_and_json(TextCompletion, TextCompletion) | errors(*GENERATION),
)
async def create_completion(
    body: CompletionRequest, request: Request, state: State, principal: CurrentPrincipal
) -> Response:
    request_id = f"cmpl-{uuid.uuid4().hex}"
    # Templating and tokenisation are CPU-bound: off the event loop, so /health and every other
    # request keep being served while a long prompt is prepared.
    queued = await run_in_threadpool(prepare_completion, state, body, principal, request_id)
    echo = completion_echo(state, body, queued.prompt_token_ids)
    fmt = CompletionFormatter(request_id, body.model, echo, body.logprobs is not None)
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
