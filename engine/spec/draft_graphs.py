# CUDA graphs for the draft model's greedy proposal chain: k single-token passes per step,
# each a few hundred small kernels for a small model, would be launch-bound run eagerly. One
# graph per batch size (the decode ladder) captures all k passes; a batch is padded up to the
# next size with rows that want no drafts (limit 0: they idle at position 0, writing nothing).
# A batch whose rows want fewer than k drafts still runs the k passes; rows past their own
# count idle (DraftProposer.draft_pass), so the graph's output is theirs to truncate.
#
# Static buffers:
#   ids, last_pos, limit: [max_bs] int64; block_tables: [max_bs, max_blocks] int32
#   drafts: [max_bs, k] int64, the graph's output
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.core.request import Request
from engine.runner.cuda_graphs import capture_graph, capture_sizes

if TYPE_CHECKING:
    from engine.spec.draft import DraftProposer


class DraftChainGraphs:
    def __init__(self, proposer: DraftProposer, k: int, max_num_seqs: int, max_model_len: int):
        from kernels.paged_decode_attention import choose_num_splits

        self.proposer = proposer
        self.k = k
        self.device = d = proposer.device
        self.sizes = capture_sizes(max_num_seqs)
        self.max_bs = self.sizes[-1]
        self.max_blocks = -(-max_model_len // proposer.block_size)
        self.max_seq_len = self.max_blocks * proposer.block_size
        self.ids = torch.zeros(self.max_bs, dtype=torch.int64, device=d)
        self.last_pos = torch.zeros(self.max_bs, dtype=torch.int64, device=d)
        self.limit = torch.zeros(self.max_bs, dtype=torch.int64, device=d)
        self.block_tables = torch.zeros(self.max_bs, self.max_blocks, dtype=torch.int32, device=d)
        self.query_start = torch.arange(self.max_bs + 1, dtype=torch.int32, device=d)
        self.drafts = torch.zeros(self.max_bs, k, dtype=torch.int64, device=d)
        heads = proposer.model_config.num_kv_heads
        self.num_splits = {
            bs: choose_num_splits(bs, heads, min(self.max_seq_len, 8192)) for bs in self.sizes
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _chain(self, bs: int) -> None:
        ids = self.ids[:bs]
        for j in range(self.k):
            logits = self.proposer.draft_pass(
                j, ids, self.last_pos[:bs], self.limit[:bs], self.block_tables[:bs],
                self.query_start[: bs + 1], self.max_seq_len, self.num_splits[bs],
            )  # fmt: skip
            ids = logits.argmax(dim=-1)
            self.drafts[:bs, j] = ids

    @torch.inference_mode()
    def capture(self, pool=None):
        if self.device.type != "cuda":
            return pool  # nothing to capture: replay runs the same path eagerly (CPU tests)
        for bs in reversed(self.sizes):  # largest first: smaller ones reuse its memory
            self.graphs[bs], pool = capture_graph(lambda bs=bs: self._chain(bs), self.device, pool)
        torch.cuda.synchronize(self.device)
        return pool

    def can_run(self, requests: list[Request]) -> bool:
        return len(requests) <= self.max_bs and all(
            len(r.block_ids) <= self.max_blocks and r.spec_slots <= self.k for r in requests
        )

    @torch.inference_mode()
    def run(self, requests: list[Request]) -> list[list[int]]:
        """Greedy drafts [n][k] for requests can_run accepted (one H2D, one D2H copy)."""
        n = len(requests)
        bs = next(s for s in self.sizes if s >= n)
        width = max(len(r.block_ids) for r in requests)
        # One host buffer: ids, last_pos, limit for bs rows (padding rows zero), then tables.
        host = np.zeros(3 * bs + n * width, dtype=np.int64)
        host[:n] = [r.token_ids[-1] for r in requests]
        host[bs : bs + n] = [r.num_tokens - 1 for r in requests]
        host[2 * bs : 2 * bs + n] = [r.spec_slots for r in requests]
        tables = host[3 * bs :].reshape(n, width)
        for i, r in enumerate(requests):
            tables[i, : len(r.block_ids)] = r.block_ids
        src = torch.from_numpy(host)
        if self.device.type == "cuda":
            src = src.pin_memory().to(self.device, non_blocking=True)
        self.ids[:bs].copy_(src[:bs])
        self.last_pos[:bs].copy_(src[bs : 2 * bs])
        self.limit[:bs].copy_(src[2 * bs : 3 * bs])
        self.block_tables[:n, :width].copy_(src[3 * bs :].view(n, width))
        if self.device.type == "cuda":
            self.graphs[bs].replay()
        else:  # the same static-buffer path, run eagerly (tests the layout on the CPU)
            self._chain(bs)
        return self.drafts[:n].tolist()
