# The [vocab, hidden] tables split by vocabulary rows over ranks: the input embedding (each
# rank looks up the ids it holds, zeros elsewhere, one all-reduce) and the LM head (each rank
# scores its rows, one all-gather of the logits). Rank r holds rows [r * n, (r + 1) * n) with
# n = ceil(vocab / size); rows past the vocabulary are zero padding whose logits are cut off.
# One rank: a plain embedding and matmul.
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models import ops
from engine.models.linear import Source
from engine.parallel.tensor_parallel import SINGLE, TensorParallel


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self, vocab_size: int, hidden_size: int, dtype: torch.dtype, tp: TensorParallel = SINGLE
    ) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.rows_per_rank = -(-vocab_size // tp.size)
        self.start = tp.rank * self.rows_per_rank
        self.num_real = max(0, min(self.rows_per_rank, vocab_size - self.start))
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size, dtype=dtype))
        self.loaded = False

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [num_tokens] → [num_tokens, hidden]"""
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.num_real)
        out = F.embedding(torch.where(mine, local, 0), self.weight)
        out.mul_(mine.unsqueeze(1).to(out.dtype))  # ids held elsewhere contribute zeros
        return self.tp.all_reduce(out)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [num_rows, hidden] → logits [num_rows, vocab] in the model dtype."""
        local = ops.linear(hidden, self.weight)  # [num_rows, rows_per_rank]
        if self.tp.size == 1:
            return local
        return self.tp.gather_last_dim(local)[:, : self.vocab_size]

    @torch.no_grad()
    def load(self, attr: str, shard_index: int, src: Source) -> None:
        if attr != "weight":
            raise KeyError(f"no {attr!r} in an embedding")
        if src.shape[0] != self.vocab_size:
            raise ValueError(f"embedding has {src.shape[0]} rows, expected {self.vocab_size}")
        rows = src.read(slice(self.start, self.start + self.num_real), None)
        self.weight[: self.num_real].copy_(rows)
        self.weight[self.num_real :].zero_()
        self.loaded = True

    def missing(self) -> list[str]:
        return [] if self.loaded else ["weight"]
