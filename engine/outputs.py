# What the engine hands back: per-step deltas for streaming, whole outputs for offline use.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.usage import RequestUsage as RequestUsage  # its home; re-exported for the engine


@dataclass(slots=True)
class RequestDelta:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" once finished
    error: str | None
    usage: RequestUsage
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    # engine.sampling.logprobs.TokenLogprob per new token, when the request asked for logprobs
    logprobs: list[Any] | None = None
    # With its first tokens, when asked: TokenLogprob per prompt token after the first
    prompt_logprobs: list[Any] | None = None
    # n > 1 (engine/core/request_group.py): the choice these tokens belong to; on the request's
    # final delta, every choice's finish reason. A choice that ends before the others has its
    # finish_reason set on a delta that is not `finished`.
    index: int = 0
    finish_reasons: list[str | None] | None = None


@dataclass(slots=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None
    logprobs: list[Any] | None = None  # engine.sampling.logprobs.TokenLogprob per token, when asked
    prompt_logprobs: list[Any] | None = None  # per prompt token after the first, when asked
    # n > 1: each choice's output, in index order; this output's own fields are choice 0's
    # (its finish_reason the request's).
    choices: list[CompletionOutput] = field(default_factory=list)

    def apply(self, delta: RequestDelta) -> None:
        if self.choices:
            choice = self.choices[delta.index]
            choice.apply_tokens(delta)
            reason = delta.finish_reasons[delta.index] if delta.finish_reasons else None
            reason = reason or delta.finish_reason
            if reason is not None and choice.finish_reason is None:
                choice.finish_reason, choice.error = reason, delta.error
                choice.finish_time = delta.finish_time
            if delta.index != 0:
                if delta.finished:  # the request's end: the group's reason and usage
                    self.num_cached_tokens = delta.usage.cached_tokens
                    self.finish_reason, self.error = delta.finish_reason, delta.error
                    self.finish_time = delta.finish_time
                return
        self.apply_tokens(delta)
        if delta.finished:
            self.finish_reason = delta.finish_reason
            self.error = delta.error
            self.finish_time = delta.finish_time

    def apply_tokens(self, delta: RequestDelta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.token_ids.extend(delta.new_token_ids)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        self.text += delta.new_text
        self.num_cached_tokens = delta.usage.cached_tokens
        self.num_preemptions = delta.usage.preemptions
        self.first_token_time = delta.first_token_time


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_waiting_tokens: int = 0  # tokens of the waiting requests (prefill work queued)
    # Engine totals (vllm:spec_decode_num_draft_tokens / vllm:spec_decode_num_accepted_tokens).
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    # Triton compilations since the engine was ready (kernels/compile_counter.py): each stalled
    # a step; start-up warm-up should leave none.
    kernel_compiles: int = 0
