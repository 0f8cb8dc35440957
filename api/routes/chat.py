# POST /v1/chat/completions
from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import CurrentPrincipal, State
from api.generation import Formatter, created_now, generate
from api.prepare import prepare_chat
from api.schemas.chat import ChatCompletionRequest
from api.schemas.sampling import Usage

router = APIRouter(tags=["chat"])


class ChatFormatter(Formatter):
    def __init__(self, request_id: str, model: str, service_tier: str) -> None:
        self.base = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created_now(),
            "model": model,
            "service_tier": service_tier,
            "system_fingerprint": None,
        }
        self.first_chunk = self._chunk({"role": "assistant", "content": ""}, None)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self.base | {"choices": [choice]}

    def chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return self._chunk({"content": text}, finish_reason)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.base | {"choices": [], "usage": usage.model_dump()}

    def response(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        return self.base | {
            "object": "chat.completion",
            "choices": [choice],
            "usage": usage.model_dump(),
        }


@router.post("/v1/chat/completions")
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: State, principal: CurrentPrincipal
) -> Response:
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    queued = prepare_chat(state, body, principal, request_id)
    tier = "flex" if body.priority == "batch" else "default"
    fmt = ChatFormatter(request_id, body.model, tier)
    return await generate(
        request,
        state,
        queued,
        fmt,
        stream=body.stream,
        include_usage=body.include_usage,
        principal=principal,
    )
