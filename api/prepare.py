# Request preparation shared by the HTTP routes and the batch runner: the model and context
# checks, tokenisation (the chat template) and the queued request. Raises APIError.
from __future__ import annotations

from api.admission import build_request, check_context, check_model
from api.errors import invalid_param
from api.schemas.chat import ChatCompletionRequest
from api.schemas.completions import CompletionRequest
from metering.keys import Principal
from workers import protocol as p


def prepare_chat(
    state, body: ChatCompletionRequest, principal: Principal, request_id: str
) -> p.QueuedRequest:
    check_model(state, body.model)
    try:
        prompt = state.tokenizer.apply_chat_template(
            body.template_messages(), add_generation_prompt=True, tokenize=True
        )
    except Exception as exc:  # template errors are the request's fault (bad roles, order, ...)
        raise invalid_param("messages", f"could not apply the chat template: {exc}") from exc
    check_context(state, len(prompt), body.effective_max_tokens(), "messages")
    return build_request(request_id, body, principal, "chat.completions", prompt)


def prepare_completion(
    state, body: CompletionRequest, principal: Principal, request_id: str
) -> p.QueuedRequest:
    check_model(state, body.model)
    if isinstance(body.prompt, str):
        prompt = state.tokenizer.encode(body.prompt)
    else:
        prompt = list(body.prompt)
        vocab = state.tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise invalid_param("prompt", f"prompt token ids must be in [0, {vocab})")
    if not prompt:
        raise invalid_param("prompt", "the prompt is empty")
    check_context(state, len(prompt), body.max_tokens, "prompt")
    return build_request(request_id, body, principal, "completions", prompt)
