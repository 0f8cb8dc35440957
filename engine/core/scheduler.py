# Token-budget scheduler (vLLM-v1 style): every step has one budget of tokens shared by decodes
# and prefill chunks. Each running request asks for the tokens it needs to catch up with its
# own token list (1 for a decode, a chunk for a prefill); waiting requests are admitted while
# budget, sequence slots and KV blocks remain.
#
# Priority: interactive before batch, in admission and in memory. Under KV pressure the victim
# is the lowest-class, most recently admitted running request; an arriving interactive request
# may preempt running batch requests. Preemption is by recompute: the victim's blocks are freed
# (their hashes stay in the prefix cache, so re-admission usually re-hits them) and it goes back
# to the front of its class's queue. Preemption is for transient pressure, never a failure: a
# preempted request resumes (recompute of its prompt and the tokens it already produced) however
# often that takes. It always makes progress: the victim is the most recently admitted, so the
# oldest running request of the highest class is never one, and a re-admitted victim is newer
# than everything it displaced. Admission above the engine (the worker's intake and the API's
# load shedding) keeps KV headroom so that this stays rare. The one failure: a request that can
# never fit, not even alone in the whole pool, finishes with reason "error".
#
# Within a step's budget, decodes first: a prompt chunk never takes the budget the running
# decodes need. The order among prompt chunks is engine/core/prefill_order.py's.
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.prefill_order import PrefillOrder
from engine.core.request import Priority, Request, RequestStatus
from engine.core.step_cost import PrefillPlan, PrefillPolicy, StepFeatures, chunk_pairs
from engine.spec.policy import observe_acceptance


@dataclass(slots=True)
class SchedulerOutput:
    # Decodes (one new token) come first, so kernels can take the first `num_decodes` rows
    # as a pure decode batch.
    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0
    failed: list[Request] = field(default_factory=list)
    num_preempted: int = 0
    features: StepFeatures | None = None  # the step's shape, for the cost model

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.requests


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        eos_token_ids: tuple[int, ...] = (),
        prefill_policy: PrefillPolicy | None = None,
        prefill_order: PrefillOrder | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.block_manager = block_manager
        # time.time() in the engine; a virtual clock in fleetlm/bench/schedule_sim.py
        self.clock = clock
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: dict[Priority, deque[Request]] = {p: deque() for p in Priority}
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.num_preemptions = 0
        self._admissions = 0
        self.num_spec_draft_tokens = 0  # engine totals, for metrics
        self.num_spec_accepted_tokens = 0
        # None: every step may fill its whole budget with prefill; else step_cost.py decides.
        self.prefill_policy = prefill_policy
        self.order = prefill_order or PrefillOrder(max_num_batched_tokens, max_num_seqs)
        self.last_features: StepFeatures | None = None
        # KV blocks a batch request must leave free when it is admitted beside running work:
        # what the worker forecasts interactive arrivals will need (workers/gpu/intake_budget.py).
        # Without it a batch request preempted for an interactive one was re-admitted as soon as
        # any request ended, and the next interactive arrival took it back: one flex request of
        # a worker offered 3x its rate was preempted 11 times. 0 (a bare engine): no reserve.
        self.batch_kv_reserve = 0

    # -- queue management ----------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        self.requests[request.request_id] = request
        self.waiting[request.priority].append(request)

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def finish(self, request: Request, reason: str, error: str | None = None) -> None:
        if request.is_finished:
            return
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting[request.priority].remove(request)
        # Whatever the end, blocks whose K/V are computed go to the prefix cache first: a
        # request that finishes at its first output token must still leave its prompt there.
        self.block_manager.cache_full_blocks(request)
        self.block_manager.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.error = error
        request.finish_time = self.clock()
        del self.requests[request.request_id]

    def abort(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is not None:
            self.finish(request, "abort")
        return request

    # -- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: dict[Request, int] = {}

        self.running.sort(key=lambda r: (r.priority.rank, r.admitted_seq))
        # the step's prefill tokens: a shared pool, and a grant per prompt it may take instead
        plan = self._prefill_plan(budget)
        # Decodes not reached yet in the loop: a prompt chunk leaves them their budget.
        decodes_ahead = sum(1 for r in self.running if r.num_tokens - r.num_computed_tokens == 1)
        reserve: int | None = None  # held back from long prompts for short waiting ones
        batch_reserve: int | None = None  # ... from batch prompts for waiting interactive ones
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_pending = request.num_tokens - request.num_computed_tokens
            num_new = min(num_pending, budget)
            if num_pending == 1:
                decodes_ahead -= 1
            else:  # a prompt chunk: within its grant or the pool (the plan)
                cap = min(plan.cap(request), budget - decodes_ahead)
                if request.priority is Priority.BATCH and self.waiting[Priority.INTERACTIVE]:
                    if batch_reserve is None:
                        batch_reserve = self.order.interactive_reserve(
                            cap, self.waiting, self.block_manager
                        )
                    cap -= batch_reserve
                if self.order.is_long(request):
                    if reserve is None:
                        reserve = self.order.short_reserve(
                            cap, self.waiting, len(self.running), self.block_manager
                        )
                    others = len(self.running) - 1 + self.num_waiting
                    cap = min(cap - reserve, self.order.chunk_cap(request, others))
                num_new = min(num_new, cap)
                if num_new <= 0:
                    i += 1
                    continue
            # Draft slots (speculative decoding) only for decodes, only from leftover budget,
            # and never at the cost of a preemption: without room they are simply dropped.
            num_drafts = min(request.spec_slots, budget - 1) if num_pending == 1 else 0
            if num_drafts > 0 and self.block_manager.allocate_slots(request, 1 + num_drafts):
                request.spec_slots = num_drafts
                scheduled[request] = 1 + num_drafts
                budget -= 1 + num_drafts
                i += 1
                continue
            if request.spec_slots or request.spec_token_ids:
                _clear_drafts(request)
            while not self.block_manager.allocate_slots(request, num_new):
                if len(self.running) == 1:
                    self._fail_unfittable(request, out)
                    break
                victim = max(self.running, key=lambda r: (r.priority.rank, r.admitted_seq))
                if victim is not request and victim.num_tokens - victim.num_computed_tokens == 1:
                    decodes_ahead -= 1  # (the victim sorts last: not reached yet)
                budget += scheduled.pop(victim, 0)
                plan.give_back(victim)
                self._preempt(victim, out)
                if victim is request:
                    break
            else:
                scheduled[request] = num_new
                budget -= num_new
                if num_pending > 1:
                    plan.take(request, num_new)
                i += 1

        if out.num_preempted == 0:
            self._admit_waiting(budget, plan, scheduled, out)

        # Always: the worker prices its work with the same shape (workers/gpu/step_prices.py).
        out.features = self.last_features = _features(scheduled.items())
        self._order(out, scheduled.items())
        now = self.clock()
        for request in out.requests:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        return out

    def _prefill_plan(self, budget: int) -> PrefillPlan:
        if self.prefill_policy is None:
            return PrefillPlan(budget)
        decodes, prefills = [], []
        for r in self.running:
            (decodes if r.num_tokens - r.num_computed_tokens == 1 else prefills).append(r)
        for priority in Priority:
            prefills.extend(self.waiting[priority])
        now, policy = self.clock(), self.prefill_policy
        return policy.plan(decodes, prefills, budget, now)

    @staticmethod
    def _order(out: SchedulerOutput, items) -> None:
        # Decodes first; the stable sort keeps the priority order within each group.
        items = sorted(items, key=lambda kv: kv[1] != 1)
        out.requests = [r for r, _ in items]
        out.num_new_tokens = [n for _, n in items]
        out.num_decodes = sum(1 for _, n in items if n == 1)

    def apply_drafts(self, out: SchedulerOutput) -> None:
        """After the proposer filled `spec_token_ids` (at most `spec_slots` each): shrink each
        request's share to 1 + its real drafts and re-sort. Budget a proposer left unused stays
        unused this step; blocks reserved for it are trimmed after the step."""
        items = []
        for request, n in zip(out.requests, out.num_new_tokens):
            if request.spec_slots:
                del request.spec_token_ids[request.spec_slots :]
                n = 1 + len(request.spec_token_ids)
            elif request.spec_token_ids:  # proposed before scheduling but granted no slots
                _clear_drafts(request)
            items.append((request, n))
        self._order(out, items)
        scheduled = set(out.requests)
        for request in self.running:  # left out of this step altogether (budget ran out)
            if request not in scheduled and request.spec_token_ids:
                _clear_drafts(request)

    def _admit_waiting(
        self,
        budget: int,
        plan: PrefillPlan,
        scheduled: dict[Request, int],
        out: SchedulerOutput,
    ) -> None:
        """Admits waiting requests, in the prefill order's admission order, while the step's
        token budget, its prefill plan (the pool, or a prompt's own grant), sequence slots and
        KV blocks last."""
        bm = self.block_manager
        for request in self.order.admission_order(self.waiting):
            if budget <= 0 or (plan.exhausted and not plan.grants):
                return
            if plan.exhausted and request not in plan.grants:
                continue  # only a prompt with a grant of its own may still come in
            priority = request.priority
            if priority is Priority.BATCH and out.num_preempted:
                continue  # batch requests just preempted must not be replaced this step
            if len(self.running) >= self.max_num_seqs:
                # Every sequence slot is taken: an interactive request takes a batch
                # request's seat, as it would take its memory below.
                if priority is not Priority.INTERACTIVE or not self._preempt_batch(scheduled, out):
                    continue
                budget = self.max_num_batched_tokens - sum(scheduled.values())
                if budget <= 0:
                    return
            if bm.num_blocks_for(request.num_tokens + 1) > bm.num_blocks:
                self._fail_unfittable(request, out)  # leaves the queue in finish()
                continue
            if request.fork_source is not None:
                hits = self._fork_blocks(request)
                if hits is None:
                    continue  # its source's prompt is not computed yet: it will be
            else:
                hits = bm.find_cached_prefix(request)
            if priority is Priority.BATCH and self.running and self.batch_kv_reserve:
                # (a cached prefix costs free blocks too unless running requests hold it: a
                # preempted request's own blocks are cached, and free)
                held = sum(bm.blocks[b].ref_count > 0 for b in hits)
                needs = bm.num_blocks_for(request.num_tokens + 1) - held
                if bm.num_free_blocks - needs < self.batch_kv_reserve:
                    continue  # it waits for the room, behind nothing of a higher class
            num_computed = len(hits) * bm.block_size
            others = len(self.running) + self.num_waiting - 1
            chunk = min(plan.cap(request, num_computed), self.order.chunk_cap(request, others))
            num_new = min(request.num_tokens - num_computed, budget, chunk)
            while not bm.allocate_slots(request, num_new, hits):
                if priority is not Priority.INTERACTIVE or not self._preempt_batch(scheduled, out):
                    # Head of line blocks: a request must not take the memory one ahead of it
                    # is waiting for.
                    return
                budget = self.max_num_batched_tokens - sum(scheduled.values())
                num_new = min(request.num_tokens - num_computed, budget, chunk)
            self.waiting[priority].remove(request)
            bm.prefix_cache_queries += request.num_tokens
            bm.prefix_cache_hits += num_computed
            request.num_computed_tokens = num_computed
            if request.num_preemptions == 0:  # (a resumed request's hits may pass its prompt)
                request.num_cached_tokens = min(num_computed, request.num_prompt_tokens)
            request.status = RequestStatus.RUNNING
            request.fork_source = None  # (a preempted copy resumes from the prefix cache)
            request.spec_slots = 0
            request.admitted_seq = self._admissions
            self._admissions += 1
            self.running.append(request)
            scheduled[request] = num_new
            budget -= num_new
            plan.take(request, num_new)

    def _fork_blocks(self, request: Request) -> list[int] | None:
        """The leading full prompt blocks a copy of an n > 1 request shares with the copy that
        computes the prompt (by reference count: nothing is copied or computed again). Every
        shared block is full and computed, so neither copy ever writes into one; the copy
        computes its own partial last block and at least the prompt's last token (the position
        it samples its first token from). None: wait, the source has not computed them yet
        (it is admitted first and its next step computes them). A source that is gone, or was
        preempted, shares nothing; the prefix cache may still serve the copy."""
        source, bm = request.fork_source, self.block_manager
        num_shared = (request.num_tokens - 1) // bm.block_size
        if source.status is RequestStatus.WAITING and source.num_preemptions == 0:
            return None if num_shared else []
        if source.status is not RequestStatus.RUNNING:
            return bm.find_cached_prefix(request)
        if source.num_computed_tokens < num_shared * bm.block_size:
            return None
        return source.block_ids[:num_shared]

    def _preempt_batch(self, scheduled: dict[Request, int], out: SchedulerOutput) -> bool:
        batch = [r for r in self.running if r.priority is Priority.BATCH]
        if not batch:
            return False
        victim = max(batch, key=lambda r: r.admitted_seq)
        scheduled.pop(victim, None)
        self._preempt(victim, out)
        return True

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        out.num_preempted += 1
        self.num_preemptions += 1
        request.num_preemptions += 1
        self.running.remove(request)
        self.block_manager.free(request)
        _clear_drafts(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        self.waiting[request.priority].appendleft(request)

    def _fail_unfittable(self, request: Request, out: SchedulerOutput) -> None:
        bm = self.block_manager
        self.finish(
            request,
            "error",
            f"request needs {bm.num_blocks_for(request.num_tokens + 1)} KV blocks of "
            f"{bm.block_size} tokens but the whole pool holds {bm.num_blocks}",
        )
        out.failed.append(request)

    def kv_outlook(self, expected_output: int) -> dict[Priority, tuple[int, int]]:
        """Per priority: (KV blocks its unfinished requests hold, blocks they still need to
        reach their expected length: the prompt and min(max_tokens, max(expected_output,
        produced + 1)) output tokens). A waiting or preempted request holds nothing."""
        bm = self.block_manager
        outlook = dict.fromkeys(Priority, (0, 0))
        for r in self.requests.values():
            output = min(r.max_tokens, max(expected_output, r.num_output_tokens + 1))
            held = len(r.block_ids)
            more = max(0, bm.num_blocks_for(r.num_prompt_tokens + output) - held)
            h, m = outlook[r.priority]
            outlook[r.priority] = (h + held, m + more)
        return outlook

    # -- after the forward pass ----------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, sampled: list) -> list[Request]:
        """Advance computed counts and append sampled tokens, for each request whose scheduled
        tokens reached the end of its token list. `sampled` has one entry per such request: a
        token id, or a list (verified drafts + the bonus token) when the step speculated.
        Returns requests that got new tokens."""
        advanced: list[Request] = []
        k = 0
        now = self.clock()
        bm = self.block_manager
        for request, num_new in zip(out.requests, out.num_new_tokens):
            drafts = request.spec_token_ids
            request.num_computed_tokens += num_new - len(drafts)
            if request.num_computed_tokens != request.num_tokens:
                bm.cache_full_blocks(request)
                continue
            tokens = sampled[k]
            k += 1
            if request.first_token_time is None:
                request.first_token_time = now
            advanced.append(request)
            if not drafts and not request.spec_slots and type(tokens) is int:
                # The common case: one sampled token and no blocks reserved for drafts.
                request.token_ids.append(tokens)
                reason = self._stop_reason(request, tokens)
                if reason is not None:
                    self.finish(request, reason)
                else:
                    bm.cache_full_blocks(request)
                continue
            if isinstance(tokens, int):
                tokens = [tokens]
            if drafts:
                # tokens = the accepted drafts + one bonus token. The accepted drafts' K/V were
                # written by this very pass over exactly the committed context; the bonus
                # token's K/V come next step, like any decode's. Slots past that hold rejected
                # drafts' K/V: beyond num_computed_tokens, so never read and later overwritten.
                num_accepted = len(tokens) - 1
                request.num_computed_tokens += num_accepted
                request.spec_proposed += len(drafts)
                request.spec_accepted += num_accepted
                self.num_spec_draft_tokens += len(drafts)
                self.num_spec_accepted_tokens += num_accepted
                observe_acceptance(request, len(drafts), num_accepted)
                _clear_drafts(request)
            reason = None
            for token in tokens:  # exactly as token-by-token decoding would stop
                request.token_ids.append(token)
                reason = self._stop_reason(request, token)
                if reason is not None:
                    break
            if reason is not None:
                self.finish(request, reason)
                continue
            bm.trim(request, request.num_tokens)
            bm.cache_full_blocks(request)
        return advanced

    def _stop_reason(self, request: Request, token: int) -> str | None:
        params = request.params
        num_out = request.num_output_tokens
        if num_out >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return "stop"
            if token in params.stop_token_ids:
                return "stop"
        if request.grammar is not None and request.grammar.completed(request):
            return "stop"  # the grammar admits nothing more (a model may lack an EOS token)
        if num_out >= request.max_tokens:
            return "length"
        return None


def _features(items) -> StepFeatures:
    """The step's shape before it runs (num_computed_tokens has not advanced yet)."""
    decodes = context = tokens = 0
    pairs = 0.0
    for request, n in items:
        if request.num_tokens - request.num_computed_tokens == 1:  # a decode (maybe drafts)
            decodes += 1
            context += request.num_tokens
        else:
            tokens += n
            pairs += chunk_pairs(n, request.num_computed_tokens)
    return StepFeatures(decodes, context, tokens, pairs)


def _clear_drafts(request: Request) -> None:
    request.spec_token_ids = []
    request.spec_draft_probs = None
    request.spec_slots = 0


def build_scheduler(
    config: EngineConfig,
    block_manager: BlockManager,
    eos_token_ids: tuple[int, ...],
    clock: Callable[[], float] = time.time,
) -> Scheduler:
    """The scheduler of an engine with `config`: its prefill policy (with a step-time target)
    and prefill order. fleetlm/bench/schedule_sim.py builds the same one on a virtual clock."""
    policy = None
    if config.step_time_target_s is not None or config.pace_long_prompts:
        policy = PrefillPolicy(
            config.step_time_target_s or math.inf,
            ttft_guard_s=config.prefill_ttft_guard_s,
            ttft_target_s=config.ttft_target_s,
            long_prompt_share=config.long_prompt_share,
            ttft_prompt_tokens=config.ttft_prompt_tokens,
        )
    return Scheduler(
        block_manager,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        eos_token_ids=eos_token_ids,
        prefill_policy=policy,
        prefill_order=PrefillOrder(
            config.max_num_batched_tokens,
            config.max_num_seqs,
            short_first=config.short_prefill_first,
            long_prompt_tokens=config.ttft_prompt_tokens,
            long_chunk=config.long_prefill_chunk,
        ),
        clock=clock,
    )
