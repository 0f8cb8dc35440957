# A new request, checked against the model (token ids in its vocabulary, prompt and output
# within its context) and given its detokenizer, before the scheduler queues it.
from __future__ import annotations

from collections.abc import Sequence

from engine.core.request import Priority, Request
from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams, resolve_max_tokens
from engine.tokenizer import Tokenizer


def new_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    priority: Priority,
    arrival_time: float | None,
    cache_salt: object,
    output_token_ids: Sequence[int],
    *,
    vocab_size: int,
    max_model_len: int,
    tokenizer: Tokenizer,
) -> Request:
    """Raises ValueError for what the model cannot take. `output_token_ids`: a resumed
    request's output so far (LLMEngine.add_request)."""
    prompt = list(prompt_token_ids)
    output = list(output_token_ids)
    if not prompt:
        raise ValueError("the prompt is empty")
    if min(prompt + output) < 0 or max(prompt + output) >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
    if params.logit_bias and not all(0 <= t < vocab_size for t in params.logit_bias):
        raise ValueError(f"logit_bias token ids must be in [0, {vocab_size})")
    if len(prompt) >= max_model_len:
        raise ValueError(f"prompt has {len(prompt)} tokens; the model's context is {max_model_len}")
    # A served request comes with max_tokens resolved (service/prepare.py); an offline caller's
    # None is resolved here. The bound is checked again either way: the last line of defence.
    max_tokens = resolve_max_tokens(params.max_tokens, len(prompt), max_model_len)
    if len(prompt) + max_tokens > max_model_len:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the "
            f"model's context of {max_model_len} tokens"
        )
    if output and len(output) >= max_tokens:
        raise ValueError(f"{len(output)} output tokens to resume from, max_tokens {max_tokens}")
    if params.prompt_logprobs is not None:
        # No prefix-cache hits (a salt no other request has): every position must be computed.
        cache_salt = ("prompt_logprobs", request_id, cache_salt)
    request = Request(request_id, prompt, params, priority, max_tokens, arrival_time, cache_salt)
    if params.prompt_logprobs is not None:
        request.prompt_logprobs = []
    if params.detokenize:
        detok = IncrementalDetokenizer(
            tokenizer,
            prompt,
            stop=params.stop,
            skip_special_tokens=params.skip_special_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        # Token by token, as finish_step fed them: the text it holds back (a partial
        # character, a possible stop string) is then what the first run held back.
        for token in output:
            detok.update([token])
        request.detokenizer = detok
    request.token_ids.extend(output)
    return request
