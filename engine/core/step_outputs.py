# From a step's new tokens to what the caller sees: each request that got tokens has them
# detokenized (a stop string may cut them short and finish the request) and becomes one
# RequestDelta carrying its usage so far. Shared by the plain step and the overlapped one.
from __future__ import annotations

from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.outputs import RequestDelta, RequestUsage


def flush_text(request: Request) -> str:
    """The text a finished request's detokenizer still held back."""
    return request.detokenizer.flush() if request.detokenizer is not None else ""


def new_tokens_delta(scheduler: Scheduler, request: Request, start: int) -> RequestDelta:
    """The delta of a request whose tokens from `start` on are new (several when drafts were
    accepted); the scheduler has already appended them and applied EOS, stop ids and
    max_tokens."""
    if request.max_tokens == 0:
        # Prompt scoring (max_tokens 0): its prefill sampled one token, which is no output.
        del request.token_ids[request.num_prompt_tokens :]
        request.finish_reason = "length"
    new_ids = request.token_ids[start:]
    detok = request.detokenizer
    text = ""
    if detok is not None:
        for i, token in enumerate(new_ids):
            text += detok.update([token])
            if detok.stop_reason is not None:
                # Tokens after the one completing a stop string are discarded, as
                # token-by-token decoding would never have produced them.
                del request.token_ids[start + i + 1 :]
                new_ids = new_ids[: i + 1]
                break
        if detok.stop_reason is not None:
            if request.is_finished:  # length or EOS on the very token that completed it
                request.finish_reason = "stop"
            else:
                scheduler.finish(request, "stop")
        elif request.is_finished:
            text += detok.flush()
    return request_delta(request, new_ids, text)


def request_delta(request: Request, new_ids: list[int], text: str) -> RequestDelta:
    logprobs = None
    if request.step_logprobs is not None and new_ids:  # one token per step: they never draft
        logprobs, request.step_logprobs = [request.step_logprobs], None
    prompt_logprobs = None
    if (
        request.prompt_logprobs is not None
        and not request.prompt_logprobs_sent
        and (new_ids or request.is_finished)
    ):
        prompt_logprobs, request.prompt_logprobs_sent = request.prompt_logprobs, True
    delta = RequestDelta(
        request_id=request.request_id,
        new_token_ids=new_ids,
        new_text=text,
        finished=request.is_finished,
        finish_reason=request.finish_reason,
        error=request.error,
        usage=RequestUsage(
            prompt_tokens=request.num_prompt_tokens,
            cached_tokens=request.num_cached_tokens,
            completion_tokens=request.num_output_tokens,
            preemptions=request.num_preemptions,
            spec_proposed_tokens=request.spec_proposed,
            spec_accepted_tokens=request.spec_accepted,
        ),
        arrival_time=request.arrival_time,
        first_scheduled_time=request.first_scheduled_time,
        first_token_time=request.first_token_time,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        finish_time=request.finish_time,
    )
    if request.group is not None:  # a copy of an n > 1 request: the group's delta
        return request.group.regroup(request, delta)
    return delta
