# One generation request as the scheduler sees it: its tokens, how many of them have KV in
# the cache, its block table and its lifecycle.
from __future__ import annotations

import enum
import time
from typing import Any

from engine.priority import Priority as Priority  # its home; re-exported for the engine
from engine.sampling_params import SamplingParams

# Overlapped scheduling (engine/runner/overlap.py): the last token of a request whose step is on the
# device and not yet back on the host. The next step's batch reads the real id on the device.
PENDING_TOKEN = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    __slots__ = (
        "admitted_seq",
        "arrival_time",
        "block_hashes",
        "block_ids",
        "block_table_cache",
        "cache_salt",
        "choice_index",
        "detokenizer",
        "draft_lag",
        "error",
        "finish_reason",
        "finish_time",
        "first_scheduled_time",
        "first_token_time",
        "fork_source",
        "generator",
        "grammar",
        "group",
        "max_tokens",
        "ngram_index",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_registered_blocks",
        "params",
        "priority",
        "prompt_logprobs",
        "prompt_logprobs_sent",
        "request_id",
        "spec_acceptance",
        "spec_accepted",
        "spec_draft_probs",
        "spec_generator",
        "spec_probe_interval",
        "spec_proposed",
        "spec_slots",
        "spec_token_ids",
        "status",
        "step_logprobs",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: Priority,
        max_tokens: int,
        arrival_time: float | None = None,
        cache_salt: Any = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt followed by output
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.max_tokens = max_tokens  # resolved: never None
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.cache_salt = cache_salt  # extra key mixed into the first block's hash (tenant)
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.num_preemptions = 0  # times it was preempted (recomputed on resume); billed in usage
        self.block_ids: list[int] = []
        # (the block_ids list it mirrors, its length then, int32 array): batch preparation
        # copies this row instead of converting the list every step.
        self.block_table_cache: tuple[list[int], int, Any] | None = None
        self.block_hashes: list[int] = []  # hash of each full block of token_ids, in order
        self.num_registered_blocks = 0  # leading blocks already published to the prefix cache
        self.admitted_seq = -1  # order of the latest admission; larger = more recent
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.generator: Any = None  # torch.Generator for seeded sampling, made by the runner
        self.detokenizer: Any = None
        # Constrained decoding: engine.sampling.grammar_mask.GrammarState once its grammar is
        # compiled.
        self.grammar: Any = None
        # engine.sampling.logprobs.TokenLogprob of the token the last collected step sampled
        # (logprobs on)
        self.step_logprobs: Any = None
        # engine.sampling.logprobs.TokenLogprob per prompt token after the first, when asked ([]
        # until computed); sent once, with the request's first delta that has tokens.
        self.prompt_logprobs: list[Any] | None = None
        self.prompt_logprobs_sent = False
        # n > 1 (engine/core/request_group.py): the group it is a copy of, its choice index, and
        # until its admission the copy whose prompt KV blocks it forks (None: computes its own).
        self.group: Any = None
        self.choice_index = 0
        self.fork_source: Request | None = None
        # Speculative decoding. Drafts are scheduled and scored but never part of token_ids:
        # only verified tokens are appended, so block hashes never cover a rejected token.
        self.spec_slots = 0  # draft slots wanted (set by the policy) / granted (by the scheduler)
        self.spec_token_ids: list[int] = []  # this step's drafts, at positions num_tokens, ...
        self.spec_draft_probs: Any = None  # [len(drafts), vocab] draft distribution; None = argmax
        self.spec_acceptance = 1.0  # EMA of the per-step acceptance rate (optimistic start)
        self.spec_probe_interval = 0  # while switched off: steps between probes (0: drafting)
        self.spec_proposed = 0
        self.spec_accepted = 0
        self.spec_generator: Any = None  # the draft model's own seeded generator
        self.ngram_index: Any = None  # spec.ngram.NgramIndex, built on the first lookup
        # Draft model only: positions from here on may be missing from the draft's cache (it
        # skips decode steps that verify nothing); None = in sync. See spec/draft.py.
        self.draft_lag: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})"
        )
