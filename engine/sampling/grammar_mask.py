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
from kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_ref


@dataclass(slots=True)
class GrammarState:
    """A constrained request's matcher and how many of its output tokens it has consumed."""

    matcher: LLMatcher
    num_consumed: int = 0

    def catch_up(self, request: Request) -> None:
        """Feed the matcher the output tokens it has not seen (the previous step's token; a
        resumed request's whole output the first time). A token the grammar rejects leaves the
        matcher in its error state, which allows only the end of sequence."""
        start = request.num_prompt_tokens + self.num_consumed
        tokens = request.token_ids
        if start >= len(tokens):
            return  # the usual case, every step: nothing new (no slice of the whole output)
        new = tokens[start:]
        assert PENDING_TOKEN not in new, "constrained requests schedule from committed tokens"
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
        # (the rows are then one bit wider than the logits; apply() ignores the extra bits).
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32  # int32 words per row, bit b of word w: id 32w+b
        self.device = device
        # The row of a request in an error or stopped state: only the end of sequence.
        self._eos_only = np.zeros(self.words, dtype=np.uint32)
        for t in eos_token_ids:
            if 0 <= t < vocab_size:
                self._eos_only[t // 32] |= np.uint32(1 << (t % 32))
        self.executor = LLExecutor()
        self._host: torch.Tensor | None = None  # [capacity, words] int32 (pinned on CUDA)
        self._host_words: np.ndarray | None = None  # the same memory as numpy int32
        # The last step's logits rows and their device tensor (reused while they stay the same)
        self._row_ids: tuple[list[int], torch.Tensor] | None = None

    def fill(self, requests: list[Request]) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """`requests` per logits row. Returns (row ids [n] int64 on the device, or None when
        they are rows 0..n-1; bitmasks [n, words] int32 on the device) for the rows whose
        request has a grammar, or None when none has.
        The host buffer is reused: a constrained step fills it only after the previous step's
        sampled ids reached the host (collected, or read ahead: engine/runner/overlap.py's
        read_grammar_tokens), and that step's mask upload was queued before them: it is done."""
        rows = [i for i, r in enumerate(requests) if r.grammar is not None]
        if not rows:
            return None
        n = len(rows)
        host = self._buffer(n)
        words = self._host_words
        matchers: list[tuple[LLMatcher, int]] = []
        for slot, row in enumerate(rows):
            request = requests[row]
            state = request.grammar
            state.catch_up(request)
            matcher = state.matcher
            # An error state, or (overlapped: a request whose end is not committed yet, its
            # row to be discarded) a stopped one: let it end rather than sample from nothing.
            if matcher.is_error() or matcher.is_stopped():
                words[slot] = self._eos_only.view(np.int32)
            else:
                matchers.append((matcher, slot))
        if matchers:
            # One call for every row: llguidance computes them on its own thread pool.
            fill_next_token_bitmask_par(self.executor, matchers, words[:n])
        masks = host[:n].to(self.device, non_blocking=True)
        return self._device_row_ids(rows), masks

    def apply(self, logits: torch.Tensor, filled: tuple[torch.Tensor | None, torch.Tensor]) -> None:
        """logits [num_rows, vocab] in place: tokens outside a row's grammar become -inf."""
        row_ids, masks = filled
        if logits.device.type == "cuda":
            apply_token_bitmask(logits, masks, row_ids)  # one kernel, nothing materialized
        else:
            apply_token_bitmask_ref(logits, masks, row_ids)

    def _device_row_ids(self, rows: list[int]) -> torch.Tensor | None:
        if rows[-1] == len(rows) - 1:
            return None  # rows 0..n-1 (ascending, distinct): every sampling row is constrained
        if self._row_ids is None or self._row_ids[0] != rows:
            ids = torch.tensor(rows, dtype=torch.int64)
            if self.device.type == "cuda":
                ids = ids.pin_memory().to(self.device, non_blocking=True)
            self._row_ids = (rows, ids)  # read-only on the device: later steps may reuse it
        return self._row_ids[1]

    def _buffer(self, num_rows: int) -> torch.Tensor:
        if self._host is None or self._host.shape[0] < num_rows:
            capacity = max(num_rows, 2 * (0 if self._host is None else self._host.shape[0]), 8)
            pin = self.device.type == "cuda"
            self._host = torch.empty((capacity, self.words), dtype=torch.int32, pin_memory=pin)
            self._host_words = self._host.numpy()
        return self._host
