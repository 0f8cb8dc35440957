# Speculative decoding policy: who drafts, and how many tokens, each step.
#
# The rule (also in docs/speculative.md), evaluated before every schedule():
#   1. Off unless the engine has a proposer (EngineConfig.speculative_method) and the request
#      did not opt out (SamplingParams.speculative=False). None and True both mean "on".
#   2. Only decodes draft (requests with exactly one pending token); prefill chunks never do.
#   3. Batch gate: with B running decodes, B > spec_max_batch_size → nobody drafts this step
#      (verification costs compute a saturated GPU does not have, and the draft model, if
#      any, sits the step out: spec/draft.py).
#   4. Acceptance: each request keeps an EMA of its per-step acceptance rate (accepted /
#      proposed, weight ALPHA on the newest step, starting optimistic at 1.0). Speculation
#      must clear
#          required(B) = spec_min_acceptance × (1 + B / spec_max_batch_size)
#      (a draft must be likelier to pay as the batch grows: on the H200 the break-even
#      acceptance of a 1B draft for an 8B target is ~0.3 at batch 1-16 and ~0.5 at 64, about
#      half that for n-gram lookup, which costs nothing to propose; docs/benchmarks.md).
#      Where the proposer's cost is per request (n-gram lookup: only its drafts' verification)
#      the test is per request: a request drafts while its own EMA clears the bar. Where the
#      cost is per step (a draft model: its k proposal passes and its pass over the verify
#      batch cost about the same for 1 drafting request as for all of them), the test is the
#      batch's mean EMA, and the whole batch drafts or none of it does: a per-request rule
#      with a draft model, measured on the H200, left some request drafting in most steps and
#      ran up to 45 % slower than no speculation.
#      Whoever is switched off probes with one draft token so text that turns repetitive can
#      come back: first after PROBE_INTERVAL steps, then at twice the interval after each probe
#      that did not bring it back (up to MAX_PROBE_INTERVAL), on steps that are multiples of
#      the interval, so switched-off requests probe together and most steps verify nothing.
#      When on, every drafting request gets the full k: below the gate a draft slot costs
#      little to verify, and the draft model's captured chain runs k passes whatever a request
#      asks for (an earlier ceil(k·EMA) rule lost a third of the speed-up at acceptance 0.6).
#   5. Never more drafts than max_tokens leaves room for: the step also emits a bonus token.
# Drafts then compete for the step's token budget like prefill chunks; the scheduler grants
# them only from budget and KV blocks left over, never by preempting anyone.
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.core.request import Request

if TYPE_CHECKING:  # the scheduler imports this module
    from engine.core.scheduler import SchedulerOutput

ALPHA = 0.1
PROBE_INTERVAL = 16
MAX_PROBE_INTERVAL = 256


def observe_acceptance(request: Request, num_proposed: int, num_accepted: int) -> None:
    rate = num_accepted / num_proposed
    request.spec_acceptance = (1.0 - ALPHA) * request.spec_acceptance + ALPHA * rate


def _room(request: Request) -> int:
    """Drafts the request may still use (the step also emits a bonus token)."""
    if request.params.speculative is False:
        return 0
    return max(0, request.max_tokens - request.num_output_tokens - 1)


class Speculator:
    def __init__(self, config: EngineConfig, proposer) -> None:
        self.k = config.num_speculative_tokens
        self.max_batch_size = config.spec_max_batch_size
        self.min_acceptance = config.spec_min_acceptance
        self.proposer = proposer
        # A draft model costs per step, not per request: decide for the whole batch.
        self.per_step_cost = bool(getattr(proposer, "per_step_cost", False))
        self.num_steps_gated = 0  # steps where the batch gate switched speculation off
        self.num_plans = 0  # the policy's step clock
        self.probe_interval = 0  # per-step-cost proposers: steps between probes while off

    def _probe(self, interval: int) -> tuple[int, int]:
        """(drafts, next interval) for someone switched off with this probe interval."""
        if interval == 0:
            return 0, PROBE_INTERVAL  # just switched off: first probe after PROBE_INTERVAL
        if self.num_plans % interval:
            return 0, interval
        return 1, min(2 * interval, MAX_PROBE_INTERVAL)

    def num_drafts_for(self, request: Request, k: int, required: float) -> int:
        room = _room(request)
        if room == 0:
            return 0
        if request.spec_acceptance < required:
            drafts, request.spec_probe_interval = self._probe(request.spec_probe_interval)
            return drafts
        request.spec_probe_interval = 0
        return min(room, k)

    def _batch_drafts(self, decoding: list[Request], required: float) -> None:
        eligible = [r for r in decoding if _room(r)]
        if not eligible:
            return
        mean = sum(r.spec_acceptance for r in eligible) / len(eligible)
        if mean >= required:
            self.probe_interval = 0
            for r in eligible:
                r.spec_slots = min(_room(r), self.k)
            return
        drafts, self.probe_interval = self._probe(self.probe_interval)
        for r in eligible:
            r.spec_slots = drafts

    def plan(self, running: list[Request]) -> bool:
        """Before scheduling: set spec_slots (the drafts each request wants). False: nobody
        drafts this step (the step then runs exactly as without speculation)."""
        self.num_plans += 1
        decoding = []
        plain_only = False
        for r in running:
            r.spec_slots = 0
            r.spec_token_ids = []
            r.spec_draft_probs = None
            if r.num_tokens - r.num_computed_tokens == 1:
                decoding.append(r)
            plain_only |= r.params.needs_plain_step
        if plain_only:  # verification cannot sample its row: a plain step for everyone
            return False
        if len(decoding) > self.max_batch_size:
            self.num_steps_gated += 1
            return False
        required = self.min_acceptance * (1 + len(decoding) / self.max_batch_size)
        if self.per_step_cost:
            self._batch_drafts(decoding, required)
        else:
            for r in decoding:
                r.spec_slots = self.num_drafts_for(r, self.k, required)
        chosen = [r for r in decoding if r.spec_slots]
        if chosen:
            self.proposer.plan(chosen)
        return any(r.spec_slots for r in chosen)

    def propose(self, out: SchedulerOutput) -> None:
        """After scheduling: fill spec_token_ids for requests granted slots (the draft model
        needs those slots for its own K/V)."""
        granted = [r for r in out.requests if r.spec_slots]
        if granted:
            self.proposer.propose(granted)
