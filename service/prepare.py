# Request preparation shared by the HTTP routes and the batch runner: the model and context
# checks, tokenisation (the chat template) and the queued request. Raises APIError. CPU-bound
# (a prompt of megabytes takes a while): the API runs it in its threadpool, off the event loop,
# where a long text is encoded without holding the interpreter lock (engine/tokenizer.py). A
# prompt with more characters than the context could hold tokens of is refused before any
# tokenising, which bounds the time and memory one request can cost.
from __future__ import annotations

import time
from functools import lru_cache

from engine.grammar import GrammarCompiler
from engine.sampling_params import StructuredOutput, resolve_max_tokens
from metering.keys import Principal
from service.context import AdmissionContext
from service.errors import APIError, invalid_param
from service.queued_request import Endpoint, QueuedRequest
from service.schemas.chat import ChatCompletionRequest
from service.schemas.completions import CompletionRequest, Echo
from service.schemas.sampling import SamplingRequest
from service.schemas.tools import ToolCallParser, ToolMode, parser_for_template

# A normalizer may add a character or two (a leading "▁"): never refuse a prompt that fits.
PROMPT_CHARS_SLACK = 16


def check_model(state: AdmissionContext, model: str) -> None:
    if model != state.model_card.id:
        raise APIError(
            404,
            f"The model `{model}` does not exist; this server serves `{state.model_card.id}`.",
            param="model",
            code="model_not_found",
        )


def context_max_tokens(
    state: AdmissionContext, num_prompt: int, max_tokens: int | None, param: str
) -> int:
    """max_tokens as asked, checked against the context and resolved (None: the rest of the
    context, at least one token). The only place a served request's max_tokens is resolved:
    admission's limits, the queue's token count and the engine all read the integer."""
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
    return resolve_max_tokens(max_tokens, num_prompt, limit)


def check_prompt_chars(state: AdmissionContext, num_chars: int, param: str) -> None:
    """Refuses, without tokenising it, a prompt too long for the context whatever its tokens:
    each token stands for at most max_token_chars characters."""
    limit = state.model_card.max_model_len
    most = limit * state.tokenizer.max_token_chars + PROMPT_CHARS_SLACK
    if num_chars > most:
        raise invalid_param(
            param,
            f"This model's maximum context length is {limit} tokens. However, your prompt has "
            f"{num_chars} characters, more than {limit} tokens can hold ({most}). Please reduce "
            "the prompt.",
            code="context_length_exceeded",
        )


def _content_chars(messages: list[dict]) -> int:
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return total


def check_sampling(state: AdmissionContext, body: SamplingRequest, max_tokens: int) -> None:
    """The limits a schema cannot state: they depend on settings, the vocabulary or the prompt."""
    body.check_n(state.settings.max_n)
    max_chars = state.settings.max_stop_chars
    if any(len(s) > max_chars for s in body.stop or ()):
        raise invalid_param("stop", f"each stop sequence must be at most {max_chars} characters")
    vocab = state.tokenizer.vocab_size
    if any(t >= vocab for t in body.stop_token_ids or ()):
        raise invalid_param("stop_token_ids", f"stop_token_ids must be in [0, {vocab})")
    bias = body.bias_by_id()
    if bias and any(not 0 <= t < vocab for t in bias):
        raise invalid_param("logit_bias", f"logit_bias token ids must be in [0, {vocab})")
    body.check_max_tokens()
    # min_tokens is bounded by max_tokens (SamplingRequest.sampling) or, when none was asked, by
    # the room the context leaves after the prompt (which max_tokens resolved to).
    if body.asked_max_tokens() is None and body.min_tokens > max_tokens:
        raise invalid_param(
            "min_tokens",
            f"min_tokens ({body.min_tokens}) exceeds the {max_tokens} tokens the context leaves "
            "after the prompt",
        )


@lru_cache(maxsize=4)
def _grammar_compiler(tokenizer: object) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size, tuple(tokenizer.eos_token_ids))


def prepare_grammars(tokenizer: object) -> None:
    """Build the grammar engine's view of the vocabulary at start-up: llguidance holds the
    interpreter lock while it reads it (1-2 s at 128k ids), which at the first request with a
    schema would stall every stream the API process relays."""
    _ = _grammar_compiler(tokenizer).tokenizer  # built and cached on first access


def check_structured_output(state: AdmissionContext, body: SamplingRequest) -> None:
    """Compile the request's grammar once here (cached per spec), so a schema, regex or
    grammar that llguidance cannot take is a 400 naming its field, not a failed request."""
    asked = body.structured_output()
    if asked is None:
        return
    param, spec = asked
    try:
        _grammar_compiler(state.tokenizer).check(StructuredOutput(**spec))
    except ValueError as exc:
        raise invalid_param(param, f"{param}: {exc}") from None


def tool_call_parser(state: AdmissionContext) -> ToolCallParser:
    """The model's tool-call format: the setting, or (auto) what its chat template teaches."""
    chosen = state.settings.tool_call_parser
    if chosen != "auto":
        return chosen
    return parser_for_template(getattr(state.tokenizer, "chat_template", None))


def chat_tool_mode(state: AdmissionContext, body: ChatCompletionRequest) -> ToolMode | None:
    return body.tool_mode(tool_call_parser(state))


def prompt_ids(state: AdmissionContext, body: CompletionRequest) -> list[int]:
    if isinstance(body.prompt, str):
        check_prompt_chars(state, len(body.prompt), "prompt")
        return state.tokenizer.encode(body.prompt)
    prompt = list(body.prompt)
    vocab = state.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise invalid_param("prompt", f"prompt token ids must be in [0, {vocab})")
    return prompt


def completion_echo(
    state: AdmissionContext, body: CompletionRequest, prompt_token_ids: list[int]
) -> Echo | None:
    """What an echoing completion puts first (the prompt as sent, or its ids decoded)."""
    if not body.echo:
        return None
    decode = state.tokenizer.decode
    text = body.prompt if isinstance(body.prompt, str) else decode(prompt_token_ids)
    return Echo(text, decode(prompt_token_ids[:1], skip_special_tokens=False))


def build_request(
    request_id: str,
    body: SamplingRequest,
    principal: Principal,
    endpoint: Endpoint,
    prompt_token_ids: list[int],
    max_tokens: int,
) -> QueuedRequest:
    return QueuedRequest(
        request_id=request_id,
        tenant_id=str(principal.tenant_id),
        key_id=str(principal.key_id),
        model=body.model,
        endpoint=endpoint,
        priority=body.priority,
        prompt_token_ids=prompt_token_ids,
        sampling=body.sampling(max_tokens),
        enqueued_at=time.time(),
    )


def prepare_chat(
    state: AdmissionContext, body: ChatCompletionRequest, principal: Principal, request_id: str
) -> QueuedRequest:
    check_model(state, body.model)
    messages = body.template_messages()
    check_prompt_chars(state, _content_chars(messages), "messages")
    chat_tool_mode(state, body)  # a tool_choice that names no tool is a 400 before templating
    try:
        prompt = state.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=True,
            tokenize=True,
            tools=body.template_tools(),
        )
    except Exception as exc:  # template errors are the request's fault (bad roles, order, ...)
        raise invalid_param("messages", f"could not apply the chat template: {exc}") from exc
    max_tokens = context_max_tokens(state, len(prompt), body.asked_max_tokens(), "messages")
    check_sampling(state, body, max_tokens)
    check_structured_output(state, body)
    return build_request(request_id, body, principal, "chat.completions", prompt, max_tokens)


def prepare_completion(
    state: AdmissionContext, body: CompletionRequest, principal: Principal, request_id: str
) -> QueuedRequest:
    check_model(state, body.model)
    prompt = prompt_ids(state, body)
    if not prompt:
        raise invalid_param("prompt", "the prompt is empty")
    max_tokens = context_max_tokens(state, len(prompt), body.asked_max_tokens(), "prompt")
    check_sampling(state, body, max_tokens)
    check_structured_output(state, body)
    return build_request(request_id, body, principal, "completions", prompt, max_tokens)
