# Overlapped scheduling (EngineConfig.overlap_scheduling): step N+1 is scheduled, packed and
# launched while step N is still on the GPU, before N's sampled tokens reach the host.
#
#   host  | sched+launch N+1 | wait N | commit N, advance N+1 | (caller) | sched+launch N+2 | ...
#   GPU   |  ... step N ...  | step N+1 ......................................| step N+2 ...
#
# How: when step N is launched, every request that samples in it is "advanced" at once: its
# computed count moves past its scheduled tokens and PENDING_TOKEN stands in for the token it
# samples. The scheduler then sees the state it would see after N (one pending token each: a
# decode) and schedules N+1; the batch builder packs placeholders, and the runner fills them in
# on the device from N's sampled ids (index_select, stream-ordered after N, before any graph
# replay copies input_ids). N's ids come back through the one non-blocking copy per step and
# are committed one step late: placeholders replaced, EOS / stop ids / max_tokens / stop strings
# applied, detokenized, emitted.
#
# A request that turns out to have finished at N was also scheduled in N+1: that extra row runs
# and its sampled token is dropped at N+1's commit (never emitted, never billed). Its KV blocks
# are freed at N's commit while N+1 may still write the extra token's K/V into one of them; a
# later step that reuses the block is queued after N+1 on the same stream, so the write lands
# first and is overwritten or never read. An abort strips the pending token and its computed
# count, leaving the request exactly as the plain engine would have it after N.
#
# Sync steps: when the next schedule needs what only N's tokens tell, N is committed first
# (waiting for the GPU) and the step is scheduled from full knowledge. That is when scheduling
# may preempt (needs_sync): requests finishing at N would have freed seats and memory first.
# Constrained requests do not sync: only N+1's sampler needs N's token (for the grammar mask),
# so N+1's forward is queued first and the host reads N's ids while it runs
# (read_grammar_tokens; engine/sampling/grammar_mask.py). A
# request failed during an overlapped schedule (a prompt the whole pool cannot hold) gives
# back its pending token like an abort. New arrivals and prompt chunks need no sampled token
# and join overlapped steps; they are admitted one step later than the plain engine would when
# only the seats or blocks of requests finishing at N would have made room for them.
# Speculative decoding (drafts are proposed from the previous tokens on the host) and tensor
# parallelism (the other ranks would need rank 0's sampled ids) are refused by EngineConfig.
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.core.request import PENDING_TOKEN, Priority, Request, RequestStatus
from engine.core.step_cost import StepFeatures
from engine.core.step_outputs import new_tokens_delta
from engine.outputs import RequestDelta
from engine.sampling.sampler import HostCopy


@dataclass(slots=True)
class Unsynced:
    """A launched step whose sampled ids are not on the host yet."""

    launched: HostCopy
    # (request, its row in the sampled ids, the index of its PENDING_TOKEN), for requests that
    # sample in the step and were still unfinished when it was advanced
    pending: list[tuple[Request, int, int]]
    features: StepFeatures | None = None
    rows: dict[Request, int] = field(default_factory=dict)  # request → row, built on demand

    def feed_rows(self) -> dict[Request, int]:
        if not self.rows:
            self.rows = {r: row for r, row, _ in self.pending}
        return self.rows


class OverlapSteps:
    """The engine's overlapped step: what sits between its launches and its commits."""

    def __init__(self, scheduler, runner) -> None:
        self.scheduler = scheduler
        self.block_manager = scheduler.block_manager
        self.runner = runner
        self.unsynced: Unsynced | None = None  # the last launched step, not yet committed
        self.num_overlapped = 0  # steps launched before the previous one's tokens were back
        self.num_synced = 0  # steps that waited for the previous one (needs_sync)
        self.num_discarded = 0  # tokens sampled for requests that had already finished

    # -- before scheduling ---------------------------------------------------------------

    def needs_sync(self) -> bool:
        """Whether the next step must be scheduled from committed tokens, because scheduling
        could preempt: the running requests' next tokens may not all fit the free blocks, or
        an interactive arrival may take a running batch request's seat or memory. The plain
        engine would first have freed the seats and blocks of requests finishing at N. Also
        while a request with a penalty runs: its token counts need its last token. (A
        constrained request's mask needs it too, but only before the sampler: the step launch
        reads it ahead, read_grammar_tokens.)"""
        if self.unsynced is None:
            return False
        scheduler, bm = self.scheduler, self.block_manager
        free, bs = bm.num_free_blocks, bm.block_size
        need = 0  # blocks for every running request's pending tokens (a decode: 0 or 1)
        for r in scheduler.running:
            need += -(-r.num_tokens // bs) - len(r.block_ids)
            if r.params.uses_history:  # its penalty counts the token still on the device
                return True
        if need > free:
            return True
        arrivals = scheduler.waiting[Priority.INTERACTIVE]
        if arrivals and any(r.priority is Priority.BATCH for r in scheduler.running):
            if len(scheduler.running) >= scheduler.max_num_seqs:
                return True
            return need + bm.num_blocks_for(arrivals[0].num_tokens + 1) > free
        return False

    def sync(self) -> list[RequestDelta]:
        """Commit the unsynced step now (waits for the GPU)."""
        unsynced, self.unsynced = self.unsynced, None
        self.num_synced += unsynced is not None
        return self.commit(unsynced) if unsynced is not None else []

    def take_unsynced(self) -> Unsynced | None:
        """The step whose sampled ids the step being scheduled reads; it is committed when
        that step finishes."""
        unsynced, self.unsynced = self.unsynced, None
        self.num_overlapped += unsynced is not None
        return unsynced

    # -- after launching -----------------------------------------------------------------

    @staticmethod
    def sampling_rows(out) -> list[Request]:
        """The requests of a scheduled step that sample, in sampled-id row order (the batch
        builder's: those whose scheduled tokens reach the end of their token list)."""
        return [
            r
            for r, n in zip(out.requests, out.num_new_tokens)
            if r.num_computed_tokens + n == r.num_tokens
        ]

    def advance(self, out, rows: list[Request], launched: HostCopy | None) -> None:
        """Move a launched step's requests past their scheduled tokens; those that sample get
        PENDING_TOKEN. The step becomes the unsynced one when any of them is still live."""
        bm = self.block_manager
        for request, n in zip(out.requests, out.num_new_tokens):
            if request.is_finished:  # finished at the previous step's commit: the extra row
                continue
            request.num_computed_tokens += n
            if request.num_computed_tokens != request.num_tokens:
                bm.cache_full_blocks(request)  # a prompt chunk: every token is known
        pending = []
        for row, request in enumerate(rows):
            if request.is_finished:
                self.num_discarded += 1
                continue
            request.token_ids.append(PENDING_TOKEN)
            pending.append((request, row, request.num_tokens - 1))
        if pending:
            self.unsynced = Unsynced(launched, pending, out.features)

    # -- committing ----------------------------------------------------------------------

    def commit(self, unsynced: Unsynced) -> list[RequestDelta]:
        """Wait for an unsynced step's sampled ids and apply them as the plain engine's
        Scheduler.update_from_output and finish_step would have, one step later."""
        tokens = self.runner.collect(unsynced.launched)
        scheduler, bm = self.scheduler, self.block_manager
        deltas: list[RequestDelta] = []
        now = time.time()
        for request, row, pos in unsynced.pending:
            if request.is_finished:  # aborted since: abort() already took its pending token
                self.num_discarded += 1
                continue
            token = tokens[row]
            request.token_ids[pos] = token
            _forget_hashes_from(request, pos, bm.block_size)
            if request.first_token_time is None:
                request.first_token_time = now
            reason = scheduler._stop_reason(request, token)
            if reason is not None:
                scheduler.finish(request, reason)
            elif request.status is RequestStatus.RUNNING:  # (preempted: waiting, no blocks)
                bm.cache_full_blocks(request)
            deltas.append(new_tokens_delta(scheduler, request, pos))
        return deltas

    @staticmethod
    def has_grammar_rows(unsynced: Unsynced | None) -> bool:
        return unsynced is not None and any(r.grammar is not None for r, _, _ in unsynced.pending)

    @staticmethod
    def read_grammar_tokens(unsynced: Unsynced) -> None:
        """Before the masks of the step launched after `unsynced` are filled (its forward pass
        already queued): wait for `unsynced`'s sampled ids and feed the constrained requests'
        matchers their token, ahead of the commit (GrammarState.consume_ahead). The wait ends
        when that step ends, while the device runs the next one's forward."""
        tokens = unsynced.launched.wait()
        for request, row, pos in unsynced.pending:
            if request.grammar is not None and not request.is_finished:
                request.grammar.consume_ahead(request, pos, tokens[row])

    def before_abort(self, request: Request) -> None:
        """An aborted request gives back the token its unsynced step is sampling: as after a
        plain step, its last token is uncomputed and it has emitted everything it holds."""
        tokens = request.token_ids
        if not tokens or tokens[-1] != PENDING_TOKEN:
            return
        tokens.pop()
        _forget_hashes_from(request, len(tokens), self.block_manager.block_size)
        if request.status is RequestStatus.RUNNING:
            request.num_computed_tokens -= 1


def _forget_hashes_from(request: Request, pos: int, block_size: int) -> None:
    """Block hashes computed while token `pos` was a placeholder are wrong: drop them (never
    published: a block is published only once all its tokens are computed)."""
    keep = pos // block_size
    if len(request.block_hashes) > keep:
        del request.block_hashes[keep:]
