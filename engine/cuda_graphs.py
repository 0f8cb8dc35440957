# CUDA graphs for pure-decode steps. A decode step at batch B launches a few hundred small
# kernels; replaying a captured graph issues them in one call. Graphs are captured for a ladder
# of batch sizes; a step is padded up to the next captured size. Padding rows carry slot -1
# (store_kv skips them) and seq_len 0 (attention writes nothing useful, nobody reads it).
#
# Static buffers (allocated once, written before every replay):
#   input_ids, positions, slot_mapping: [max_bs]
#   seq_lens: [max_bs] int32; block_tables: [max_bs, max_blocks_per_seq] int32
#   logits: [max_bs, vocab] float32, the graph's output
from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.batch_builder import PreparedBatch


def capture_sizes(max_num_seqs: int) -> list[int]:
    ladder = [1, 2, 4, 8, *range(16, 257, 16), *range(288, 1025, 32)]
    sizes = [s for s in ladder if s < max_num_seqs]
    return [*sizes, max_num_seqs]


class DecodeGraphs:
    def __init__(
        self, model, kv_caches, cos_sin, max_num_seqs: int, max_model_len: int, block_size: int
    ):
        from kernels.paged_decode_attention import choose_num_splits

        self.model = model
        self.kv_caches = kv_caches
        self.cos_sin = cos_sin
        self.device = kv_caches.device
        self.sizes = capture_sizes(max_num_seqs)
        self.max_bs = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.max_seq_len = self.max_blocks * block_size
        cfg = model.config
        d = self.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=d)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=d)
        self.slot_mapping = torch.full((self.max_bs,), -1, dtype=torch.int64, device=d)
        self.seq_lens = torch.zeros(self.max_bs, dtype=torch.int32, device=d)
        self.block_tables = torch.zeros(self.max_bs, self.max_blocks, dtype=torch.int32, device=d)
        self.query_start_loc = torch.arange(self.max_bs + 1, dtype=torch.int32, device=d)
        self.logits = torch.zeros(self.max_bs, cfg.vocab_size, dtype=torch.float32, device=d)
        # Split count is part of the captured grid; splits divide each row's own context, so
        # one count serves every context length (empty splits exit at once).
        self.num_splits = {
            bs: choose_num_splits(bs, cfg.num_kv_heads, min(self.max_seq_len, 8192))
            for bs in self.sizes
        }
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs],
            query_start_loc=self.query_start_loc[: bs + 1],
            num_decodes=bs,
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            prefill_query_start_loc=None,
            max_decode_seq_len=self.max_seq_len,
            decode_num_splits=self.num_splits[bs],
        )

    def _run(self, bs: int) -> None:
        hidden = self.model(
            self.input_ids[:bs], self.positions[:bs], self._meta(bs), self.kv_caches, self.cos_sin
        )
        self.logits[:bs] = self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        # Largest first, so smaller graphs reuse the big one's memory pool.
        for bs in reversed(self.sizes):
            for _ in range(2):  # warm-up: Triton compiles and autotunes outside capture
                self._run(bs)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._run(bs)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(self.device)

    def can_run(self, num_seqs: int, num_decodes: int, max_blocks: int) -> bool:
        return (
            num_seqs == num_decodes
            and 0 < num_seqs <= self.max_bs
            and max_blocks <= self.max_blocks
        )

    def padded_size(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def replay(self, batch: PreparedBatch) -> torch.Tensor:
        """Logits [num_seqs, vocab] of a pure-decode batch (every row samples)."""
        meta = batch.meta
        n = meta.seq_lens.shape[0]
        bs = self.padded_size(n)
        width = meta.block_tables.shape[1]
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        if bs > n:
            self.slot_mapping[n:bs].fill_(-1)
            self.seq_lens[n:bs].fill_(0)
        self.graphs[bs].replay()
        return self.logits[:n]
