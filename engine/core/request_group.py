# The n copies of one request (SamplingParams.n > 1): one caller id, n choices. Each copy is a
# Request of its own to the scheduler (id "<caller id>#<index>"); copy 0 prefills the prompt and
# the others fork its prompt KV blocks (Scheduler._fork_blocks) instead of computing them again.
# Their deltas go out under the caller's id with the choice's index, and the group reads as one
# request to the caller:
#   - completion_tokens of each delta is the group's position: output tokens emitted so far by
#     all copies together (strictly growing with every token, as one request's would);
#   - a copy that ends while others run gives a delta with its finish_reason but finished False;
#     the last copy's end is the group's: finished True, the usage of the whole group (prompt and
#     cached tokens once, completion tokens summed) and every copy's finish reason.
from __future__ import annotations

import dataclasses

from engine.core.request import Request
from engine.outputs import RequestDelta
from engine.sampling_params import SamplingParams

SEED_SPAN = 2**63  # SamplingParams.seed's range


def copy_params(params: SamplingParams, index: int) -> SamplingParams:
    """Copy `index`'s sampling: its own seed (seed + index: seeded copies differ, and the same
    seed gives the same n outputs); the prompt's logprobs are copy 0's alone."""
    if index == 0:
        return dataclasses.replace(params, n=1)
    seed = None if params.seed is None else (params.seed + index) % SEED_SPAN
    return dataclasses.replace(params, n=1, seed=seed, prompt_logprobs=None)


def copy_id(request_id: str, index: int) -> str:
    return f"{request_id}#{index}"


class RequestGroup:
    __slots__ = ("finish_reasons", "members", "num_emitted", "request_id")

    def __init__(self, request_id: str, members: list[Request]) -> None:
        self.request_id = request_id
        self.members = members
        self.num_emitted = 0  # output tokens the copies' deltas carried so far
        self.finish_reasons: list[str | None] = [None] * len(members)
        for index, request in enumerate(members):
            request.group, request.choice_index = self, index
            if index:
                request.fork_source = members[0]

    @property
    def finished(self) -> bool:
        return all(reason is not None for reason in self.finish_reasons)

    def regroup(self, request: Request, delta: RequestDelta) -> RequestDelta:
        """A copy's delta as the group's (see the top of this file)."""
        delta.request_id = self.request_id
        delta.index = request.choice_index
        self.num_emitted += len(delta.new_token_ids)
        delta.usage.completion_tokens = self.num_emitted
        if not delta.finished:
            return delta
        self.finish_reasons[request.choice_index] = delta.finish_reason
        if not self.finished:
            delta.finished = False  # the copy ended, the request goes on
            return delta
        members = self.members
        usage = delta.usage
        usage.prompt_tokens = members[0].num_prompt_tokens
        usage.cached_tokens = members[0].num_cached_tokens
        usage.preemptions = sum(r.num_preemptions for r in members)
        usage.spec_proposed_tokens = sum(r.spec_proposed for r in members)
        usage.spec_accepted_tokens = sum(r.spec_accepted for r in members)
        delta.first_scheduled_time = _earliest(r.first_scheduled_time for r in members)
        delta.first_token_time = _earliest(r.first_token_time for r in members)
        delta.finish_reasons = list(self.finish_reasons)
        # The request's own end: an error or an abort of any copy is the request's.
        for reason in ("error", "abort"):
            failed = [r for r in members if r.finish_reason == reason]
            if failed:
                delta.finish_reason, delta.error = reason, failed[0].error
                break
        return delta


def _earliest(times) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
