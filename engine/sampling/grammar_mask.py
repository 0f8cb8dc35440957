# The step's grammar masks: the rows of constrained requests get a token bitmask filled on the
# host (llguidance, in parallel threads, while the GPU runs the step's forward pass that was
# queued before), copied to the device in one transfer and applied to the logits before
# sampling: outside any captured CUDA graph, on the logits the graph produced. The forward pass
# never needs the mask, so overlapped scheduling does not wait for it: step N+1's forward is
# queued with N's sampled ids fed on the device, then the host reads N's ids (ready once N ends,
# while N+1's forward runs), advances the matchers and fills N+1's masks before its sampler.
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from llguidance import LLExecutor, LLMatcher
from llguidance.numpy import fill_next_token_bitmask_par

from engine.core.request import PENDING_TOKEN, Request


@dataclass(slots=True)
class GrammarState:
    """A constrained request's matcher and how many of its output tokens it has consumed."""

    matcher: LLMatcher
    num_consumed: int = 0

    def catch_up(self, request: Request) -> None:
        """Feed the matcher the output tokens it has not seen (the previous step's token; a
        resumed request's whole output the first time). A token the grammar rejects leaves the
        matcher in its error state, which allows only the end of sequence."""
        new = request.output_token_ids[self.num_consumed :]
        assert PENDING_TOKEN not in new, "constrained requests schedule from committed tokens"
        if new:
            self.matcher.consume_tokens(new)
            self.num_consumed += len(new)

    def consume_ahead(self, request: Request, pos: int, token: int) -> None:
        """Overlapped scheduling: feed the matcher the token sampled for position `pos`, read
        from the step's host copy before that step is committed (the token there is still
        PENDING_TOKEN): the mask of the step launched after it needs it. The commit writes the
        same token; catch_up then finds it consumed."""
        if pos - request.num_prompt_tokens != self.num_consumed:
            return  # not the next output token (a resumed request catches up on its own)
        self.matcher.consume_tokens([token])
        self.num_consumed += 1

    def completed(self, request: Request) -> bool:
        """Whether the output so far leaves the grammar nothing to add but the end."""
        self.catch_up(request)
        return self.matcher.is_stopped()


class GrammarMasks:
    """Per step: fill the bitmask rows of the constrained requests, then apply them."""

    def __init__(self, vocab_size: int, device: torch.device, eos_token_ids: tuple[int, ...]):
        # llguidance's vocabulary: the model's, plus a virtual EOS id when the model has none
        # (the rows are then one bit wider than the logits; apply() cuts them).
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32  # int32 words per row, bit b of word w: id 32w+b
        self.device = device
        self.eos_token_ids = [t for t in eos_token_ids if 0 <= t < vocab_size]
        self.executor = LLExecutor()
        self._host: torch.Tensor | None = None  # [capacity, words] int32 (pinned on CUDA)
        # [32] int32: shifting a word right by these and taking bit 0 gives its 32 flags.
        self._shifts = torch.arange(32, dtype=torch.int32, device=device)

    def fill(self, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`requests` per logits row. Returns (row ids [n] int64, bitmasks [n, words] int32) on
        the device for the rows whose request has a grammar, or None when none has.
        The host buffer is reused: a constrained step fills it only after the previous step's
        sampled ids reached the host (collected, or read ahead: engine/runner/overlap.py's
        read_grammar_tokens), and that step's mask upload was queued before them: it is done."""
        rows = [i for i, r in enumerate(requests) if r.grammar is not None]
        if not rows:
            return None
        host = self._buffer(len(rows))
        matchers: list[tuple[LLMatcher, int]] = []
        for slot, row in enumerate(rows):
            state = requests[row].grammar
            state.catch_up(requests[row])
            # An error state, or (overlapped: a request whose end is not committed yet, its
            # row to be discarded) a stopped one: let it end rather than sample from nothing.
            if state.matcher.is_error() or state.matcher.is_stopped():
                words = host[slot].numpy().view(np.uint32)
                words[:] = 0
                for t in self.eos_token_ids:
                    words[t // 32] |= np.uint32(1 << (t % 32))
            else:
                matchers.append((state.matcher, slot))
        if matchers:
            # One call for every row: llguidance computes them on its own thread pool.
            fill_next_token_bitmask_par(self.executor, matchers, host[: len(rows)].numpy())
        masks = host[: len(rows)].to(self.device, non_blocking=True)
        row_ids = torch.tensor(rows, dtype=torch.int64)
        if self.device.type == "cuda":
            row_ids = row_ids.pin_memory().to(self.device, non_blocking=True)
        return row_ids, masks

    def apply(self, logits: torch.Tensor, filled: tuple[torch.Tensor, torch.Tensor]) -> None:
        """logits [num_rows, vocab] in place: tokens outside a row's grammar become -inf."""
        row_ids, masks = filled
        # [n, words, 32] flags → [n, words * 32] → the vocabulary's first `vocab` ids.
        allowed = ((masks.unsqueeze(-1) >> self._shifts) & 1).flatten(1)[:, : logits.shape[1]]
        rows = logits.index_select(0, row_ids)
        logits.index_copy_(0, row_ids, rows.masked_fill(allowed == 0, float("-inf")))

    def _buffer(self, num_rows: int) -> torch.Tensor:
        if self._host is None or self._host.shape[0] < num_rows:
            capacity = max(num_rows, 2 * (0 if self._host is None else self._host.shape[0]), 8)
            pin = self.device.type == "cuda"
            self._host = torch.empty((capacity, self.words), dtype=torch.int32, pin_memory=pin)
        return self._host
