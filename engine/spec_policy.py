# Speculative decoding policy: who drafts, and how many tokens, each step.
#
# The rule (also in docs/speculative.md), evaluated before every schedule():
#   1. Off unless the engine has a proposer (EngineConfig.speculative_method) and the request
#      did not opt out (SamplingParams.speculative=False). None and True both mean "on".
#   2. Only decodes draft (requests with exactly one pending token); prefill chunks never do.
#   3. Batch gate: with B running decodes, B > spec_max_batch_size → nobody drafts this step
#      (verification costs compute a saturated GPU does not have, and the draft model, if
#      any, sits the step out: spec_draft.py).
#   4. Acceptance: each request keeps an EMA of its per-step acceptance rate (accepted /
#      proposed, weight ALPHA on the newest step, starting optimistic at 1.0). It drafts the
#      full k while its EMA is at least
#          required(B) = spec_min_acceptance × (1 + B / spec_max_batch_size)
#      (a draft must be likelier to pay as the batch grows: the H200 surface in
#      docs/benchmarks.md puts the break-even acceptance of a 1B draft for an 8B target at
#      ~0.3 at batch 8, ~0.45 at 32 and ~0.55 at 64, and about half that for n-gram lookup,
#      which costs nothing to propose). Below, it stops drafting but probes with one draft
#      token so a request whose text turns repetitive can come back: first after
#      PROBE_INTERVAL steps, then at twice the interval after each probe that did not bring
#      it back (up to MAX_PROBE_INTERVAL), on steps shared by all switched-off requests.
#      k is not scaled by the EMA: below the gate a draft slot costs little to verify, and
#      the draft model's captured chain runs k passes whatever a request asks for; an earlier
#      ceil(k·EMA) rule lost about a third of the speed-up at acceptance 0.6.
#   5. Never more drafts than max_tokens leaves room for: the step also emits a bonus token.
# Drafts then compete for the step's token budget like prefill chunks; the scheduler grants
# them only from budget and KV blocks left over, never by preempting anyone.
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.request import Request

if TYPE_CHECKING:  # the scheduler imports this module
    from engine.scheduler import SchedulerOutput

ALPHA = 0.1
PROBE_INTERVAL = 16
MAX_PROBE_INTERVAL = 256


def observe_acceptance(request: Request, num_proposed: int, num_accepted: int) -> None:
    rate = num_accepted / num_proposed
    request.spec_acceptance = (1.0 - ALPHA) * request.spec_acceptance + ALPHA * rate


class Speculator:
    def __init__(self, config: EngineConfig, proposer) -> None:
        self.k = config.num_speculative_tokens
        self.max_batch_size = config.spec_max_batch_size
        self.min_acceptance = config.spec_min_acceptance
        self.proposer = proposer
        self.num_steps_gated = 0  # steps where the batch gate switched speculation off
        self.num_plans = 0  # the policy's step clock

    def num_drafts_for(self, request: Request, k: int, required: float) -> int:
        if request.params.speculative is False:
            return 0
        room = request.max_tokens - request.num_output_tokens - 1
        if room <= 0:
            return 0
        if request.spec_acceptance < required:
            # Switched off. Probes fall on steps that are multiples of the request's interval
            # (a power of two), so requests probe together and most steps verify nothing;
            # each probe that fails to bring the request back doubles its interval.
            interval = request.spec_probe_interval
            if interval == 0:
                request.spec_probe_interval = PROBE_INTERVAL
                return 0
            if self.num_plans % interval:
                return 0
            request.spec_probe_interval = min(2 * interval, MAX_PROBE_INTERVAL)
            return 1
        request.spec_probe_interval = 0
        return min(room, k)

    def plan(self, running: list[Request]) -> bool:
        """Before scheduling: set spec_slots (the drafts each request wants). False: nobody
        drafts this step (the step then runs exactly as without speculation)."""
        self.num_plans += 1
        decoding = []
        for r in running:
            r.spec_slots = 0
            r.spec_token_ids = []
            r.spec_draft_probs = None
            if r.num_tokens - r.num_computed_tokens == 1:
                decoding.append(r)
        if len(decoding) > self.max_batch_size:
            self.num_steps_gated += 1
            return False
        required = self.min_acceptance * (1 + len(decoding) / self.max_batch_size)
        chosen = []
        for r in decoding:
            r.spec_slots = self.num_drafts_for(r, self.k, required)
            if r.spec_slots:
                chosen.append(r)
        if chosen:
            self.proposer.plan(chosen)
        return any(r.spec_slots for r in chosen)

    def propose(self, out: SchedulerOutput) -> None:
        """After scheduling: fill spec_token_ids for requests granted slots (the draft model
        needs those slots for its own K/V)."""
        granted = [r for r in out.requests if r.spec_slots]
        if granted:
            self.proposer.propose(granted)
