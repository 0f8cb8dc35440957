# The order of prompt chunks inside a step's token budget (docs/serving.md#prefill-order); the
# scheduler asks, this decides. Decodes always come first (the scheduler leaves them their
# budget); among prompts:
# * Short before long (`short_first`): a prompt of `long_prompt_tokens` or more (a long
#   document; the TTFT target does not cover it) is admitted after the short waiting prompts,
#   and once running takes only what they leave of the budget, down to a floor of an eighth of
#   it so it keeps moving. Without this a 30k-token document holds the whole budget for four
#   steps of ~0.4 s on the H200 and every chat prompt that arrives meanwhile waits them out.
# * Long prompts in slices (`long_chunk`): while anything else runs or waits, a long prompt's
#   chunk is at most this many tokens (0: no cap), so a step lasts ~0.1 s rather than ~0.4 s:
#   what a short prompt arriving mid-document waits for, and what every running decode's next
#   token waits for. Alone, a document takes the whole budget.
# * Then interactive before batch, each in arrival order; and a running batch prompt takes only
#   what the waiting interactive prompts leave of the budget (`interactive_reserve`), down to
#   the same floor. Running requests' chunks are served before waiting ones are admitted, so
#   without it a flex prompt, or one recomputing after it was preempted for an interactive
#   request, took the step's prefill ahead of the interactive requests waiting for it.
from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_manager import BlockManager
from engine.core.request import Priority, Request


def is_long_prompt(request: Request, long_prompt_tokens: int) -> bool:
    """A document (no TTFT target): its prefill's work, the prompt or, for a request resumed
    after preemption, the prompt and the tokens it had generated, is `long_prompt_tokens` or
    more. The prefill order and the prefill policy share this one definition."""
    return request.num_tokens >= long_prompt_tokens


@dataclass(frozen=True, slots=True)
class PrefillOrder:
    max_num_batched_tokens: int
    max_num_seqs: int
    short_first: bool = True
    long_prompt_tokens: int = 4000
    long_chunk: int = 2048  # 0: no cap

    def __post_init__(self) -> None:
        if self.long_prompt_tokens < 1 or self.long_chunk < 0:
            raise ValueError("need long_prompt_tokens >= 1 and long_chunk >= 0")

    def is_long(self, request: Request) -> bool:
        return is_long_prompt(request, self.long_prompt_tokens)

    def admission_order(self, waiting: dict) -> list[Request]:
        """Waiting requests in the order to admit them: interactive before batch, arrival order
        within each, and with short_first every short prompt before the long ones."""
        order = [r for priority in Priority for r in waiting[priority]]
        if self.short_first:
            order.sort(key=self.is_long)  # stable: class and arrival order kept within each
        return order

    def chunk_cap(self, request: Request, others: int) -> int:
        """The most tokens `request`'s chunk may take with `others` requests running or waiting
        beside it."""
        if not self.long_chunk or others == 0 or not self.is_long(request):
            return self.max_num_batched_tokens
        return self.long_chunk

    def short_reserve(
        self, cap: int, waiting: dict, num_running: int, block_manager: BlockManager
    ) -> int:
        """Prefill tokens held back from a running long prompt this step: what the short waiting
        prompts that have a seat would take (their uncached parts), at most `cap` less the long
        prompt's floor. 0 without short_first."""
        if not self.short_first:
            return 0
        short = (r for priority in Priority for r in waiting[priority] if not self.is_long(r))
        return self._reserve(cap, short, self.max_num_seqs - num_running, block_manager)

    def interactive_reserve(self, cap: int, waiting: dict, block_manager: BlockManager) -> int:
        """Prefill tokens held back from a running batch prompt this step: what the waiting
        interactive prompts would take (their uncached parts; they take running batch
        requests' seats, so every one counts), at most `cap` less the floor."""
        waiting = waiting[Priority.INTERACTIVE]
        return self._reserve(cap, iter(waiting), len(waiting), block_manager)

    def _reserve(self, cap: int, requests, seats: int, bm: BlockManager) -> int:
        floor = max(1, self.max_num_batched_tokens // 8)
        if self.long_chunk:
            floor = min(floor, self.long_chunk)
        limit = cap - floor
        need = 0
        for request in requests:
            if need >= limit or seats <= 0:
                break
            need += request.num_tokens - len(bm.find_cached_prefix(request)) * bm.block_size
            seats -= 1
        return max(0, min(need, limit))
