# CUDA graphs for steps made only of decodes. A decode step at batch B launches a few hundred
# small kernels; replaying a captured graph issues them in one call. Graphs are captured for a
# ladder of batch sizes; a step is padded up to the next captured size.
#
# Two shapes share this class:
#   query_len == 1: plain decode steps (every sequence has one query token) through the split-KV
#     decode kernel. Padding rows carry slot -1 (store_kv skips them) and seq_len 0.
#   query_len == Q > 1: speculative verify steps (every sequence has 1 to Q query tokens: the
#     pending token and its drafts) through the varlen extend kernel. Real tokens are packed at
#     the front; query_start_loc gives each sequence its real length, and the padding tokens
#     after the last real one (slot -1) belong to no sequence, so attention leaves them alone
#     and they only cost their share of the dense layers. Padding sequences have no tokens.
#     Each batch size is captured at several token capacities (bs × 2, bs × 3, bs × Q: mean
#     query lengths), so a step where few sequences draft (probes, mixed acceptance) does not
#     pay for Q tokens per sequence.
# The step function may run more than the target (a draft model's forward keeps its cache in
# sync, spec/draft.py): whatever it launches is captured with it.
#
# Static buffers (allocated once, written before every replay), T = max_bs * query_len:
#   input_ids, positions, slot_mapping: [T]
#   seq_lens: [max_bs] int32; block_tables: [max_bs, max_blocks] int32
#   decode_order: [max_bs] int32, a permutation of the padded batch's rows (decode only: the
#     real rows longest first, then the padding rows in place)
#   query_start_loc: [max_bs + 1] int32
#   with shared-prefix decode (prefix_groups given, decode only): group_rows [max_groups,
#     max_rows] int32 (-1 empty), prefix_lens [max_groups] int32 (0 unused), key_start
#     [max_bs] int32; every (batch size, split count) is captured a second time with them, the
#     prefix kernel split GRAPH_PREFIX_SPLITS times, and a step that carries groups replays that
#   logits: [T, vocab], the graph's output (every real token samples in these steps): in the
#     model dtype for decode (the lm_head's matmul rounds to it anyway; a float32 copy cost
#     ~0.1 ms a step at batch 256 on an H200, and the sampler upcasts only for non-greedy
#     rows), float32 for verify steps (spec/verify.py works in float32)
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.core.prefix_groups import PrefixGroupLimits
from engine.runner.attention import AttentionMetadata
from engine.runner.batch_builder import PreparedBatch

# (input_ids [T], positions [T], meta) -> hidden [T, hidden_size]
StepForward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]
# (hidden [T, hidden_size], dtype) -> logits [T, vocab] in dtype
ComputeLogits = Callable[[torch.Tensor, torch.dtype], torch.Tensor]


# Splits of each group's prefix in a captured shared-prefix decode step: 8 groups x 8 KV heads x
# 4 = 256 programs, ~2 per SM on an H200. Untuned (benchmarks/shared_prefix_bench.py).
GRAPH_PREFIX_SPLITS = 4


def capture_sizes(max_num_seqs: int) -> list[int]:
    ladder = [1, 2, 4, 8, *range(16, 257, 16), *range(288, 1025, 32)]
    sizes = [s for s in ladder if s < max_num_seqs]
    return [*sizes, max_num_seqs]


def capture_graph(run: Callable[[], None], device: torch.device, pool=None):
    """Warm `run` up (Triton compiles and autotunes outside capture), then capture it into
    `pool` (None: a new one). Returns (graph, the pool, for the next capture to share)."""
    for _ in range(2):
        run()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        run()
    return graph, pool if pool is not None else graph.pool()


class StepGraphs:
    def __init__(
        self,
        forward: StepForward,
        compute_logits: ComputeLogits,
        *,
        vocab_size: int,
        model_dtype: torch.dtype,
        num_kv_heads: int,
        device: torch.device,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        query_len: int = 1,
        prefix_groups: PrefixGroupLimits | None = None,
    ):
        from kernels.paged_decode_attention import split_ladder

        self.forward = forward
        self.compute_logits = compute_logits
        self.device = device
        self.query_len = query_len
        self.sizes = capture_sizes(max_num_seqs)
        self.max_bs = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        self.max_seq_len = self.max_blocks * block_size
        d = device
        num_tokens = self.max_bs * query_len
        self.input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=d)
        self.positions = torch.zeros(num_tokens, dtype=torch.int64, device=d)
        self.slot_mapping = torch.full((num_tokens,), -1, dtype=torch.int64, device=d)
        self.seq_lens = torch.zeros(self.max_bs, dtype=torch.int32, device=d)
        self.block_tables = torch.zeros(self.max_bs, self.max_blocks, dtype=torch.int32, device=d)
        if query_len == 1:
            self.query_start_loc = torch.arange(self.max_bs + 1, dtype=torch.int32, device=d)
            self.decode_order = torch.arange(self.max_bs, dtype=torch.int32, device=d)
            self.row_ids = torch.arange(self.max_bs, dtype=torch.int32, device=d)
        else:
            self.query_start_loc = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=d)
        self.logits_dtype = model_dtype if query_len == 1 else torch.float32
        self.logits = torch.zeros(num_tokens, vocab_size, dtype=self.logits_dtype, device=d)
        # The decode split count is part of the captured grid. Splits divide each row's own
        # context, so one count serves every length; a few counts per batch size are captured
        # so that a step with one very long row can cut it finer (balanced_num_splits).
        self.num_kv_heads = num_kv_heads
        self.split_counts = {
            bs: split_ladder(bs, num_kv_heads, min(self.max_seq_len, 8192)) if query_len == 1
            else [0]  # verify steps run the extend kernel: no decode splits
            for bs in self.sizes
        }  # fmt: skip
        # Token capacities per sequence: [1] for decode, mean query lengths for verify.
        self.mean_lens = (
            [1] if query_len == 1 else sorted({min(2, query_len), min(3, query_len), query_len})
        )
        # Shared-prefix decode: a second graph per (size, splits) that reads the groups.
        self.shared_prefix = prefix_groups is not None and query_len == 1
        self.group_variants = [False, True] if self.shared_prefix else [False]
        if self.shared_prefix:
            g, r = prefix_groups.max_groups, prefix_groups.max_rows
            self.group_rows = torch.full((g, r), -1, dtype=torch.int32, device=d)
            self.prefix_lens = torch.zeros(g, dtype=torch.int32, device=d)
            self.key_start = torch.zeros(self.max_bs, dtype=torch.int32, device=d)
        self.graphs: dict[tuple[int, int, int, bool], torch.cuda.CUDAGraph] = {}

    def _meta(self, bs: int, mean_len: int, splits: int, grouped: bool) -> AttentionMetadata:
        if self.query_len == 1:
            groups = None
            if grouped:
                from kernels.shared_prefix_decode import PrefixGroups

                groups = PrefixGroups(self.group_rows, self.prefix_lens, self.key_start[:bs])
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
                decode_num_splits=splits,
                decode_order=self.decode_order[:bs],
                decode_prefix_groups=groups,
                decode_prefix_splits=GRAPH_PREFIX_SPLITS,
            )
        qsl = self.query_start_loc[: bs + 1]
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[: bs * mean_len],
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs],
            query_start_loc=qsl,
            num_decodes=0,
            max_query_len=self.query_len,  # a bound: shorter sequences leave programs idle
            max_seq_len=self.max_seq_len,
            prefill_query_start_loc=qsl,
        )

    def _run(self, bs: int, mean_len: int, splits: int, grouped: bool = False) -> None:
        t = bs * mean_len
        meta = self._meta(bs, mean_len, splits, grouped)
        hidden = self.forward(self.input_ids[:t], self.positions[:t], meta)
        self.logits[:t] = self.compute_logits(hidden, self.logits_dtype)

    @torch.inference_mode()
    def capture(self, pool=None):
        """Capture every size into `pool` (None: a new one); returns the pool for sharing."""
        if self.device.type != "cuda":
            return pool  # nothing to capture: replay runs the same path eagerly (CPU tests)
        # Largest first, so smaller graphs reuse the big one's memory.
        for bs in reversed(self.sizes):
            for mean_len in reversed(self.mean_lens):
                for splits in reversed(self.split_counts[bs]):
                    for grouped in self.group_variants:
                        self.graphs[bs, mean_len, splits, grouped], pool = capture_graph(
                            lambda bs=bs, m=mean_len, s=splits, g=grouped: self._run(bs, m, s, g),
                            self.device, pool,
                        )  # fmt: skip
        torch.cuda.synchronize(self.device)
        return pool

    def can_run(self, batch: PreparedBatch) -> bool:
        meta = batch.meta
        num_seqs = meta.seq_lens.shape[0]
        if not 0 < num_seqs <= self.max_bs or meta.block_tables.shape[1] > self.max_blocks:
            return False
        if self.query_len == 1:
            return meta.num_decodes == num_seqs
        # Verify shape: every sequence ends its prompt or decodes, so every token samples.
        return (
            meta.max_query_len <= self.query_len
            and batch.logits_indices.shape[0] == batch.input_ids.shape[0]
        )

    def padded_size(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def replay(self, batch: PreparedBatch) -> torch.Tensor:
        """Logits [num_tokens, vocab] of a batch can_run accepted (every token samples)."""
        meta = batch.meta
        n = meta.seq_lens.shape[0]
        t = batch.input_ids.shape[0]
        bs = self.padded_size(n)
        mean_len = next(m for m in self.mean_lens if t <= bs * m)
        splits = self.split_counts[bs][0]
        groups = meta.decode_prefix_groups if self.shared_prefix else None
        if groups is not None:  # the batch builder's suffix split count, among those captured
            wanted = meta.decode_num_splits or 1
            candidates = self.split_counts[bs]
            splits = next((c for c in candidates if c >= wanted), candidates[-1])
        elif self.query_len == 1:
            from kernels.paged_decode_attention import balanced_num_splits

            splits = balanced_num_splits(
                batch.seq_lens_host, self.num_kv_heads, candidates=self.split_counts[bs]
            )
        width = meta.block_tables.shape[1]
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.slot_mapping[:t].copy_(meta.slot_mapping)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.block_tables[:n, :width].copy_(meta.block_tables)
        if bs > n:
            self.seq_lens[n:bs].fill_(0)
        if self.query_len == 1:
            self.decode_order[:n].copy_(meta.decode_order)  # the batch builder's, always set
            if bs > n:
                self.slot_mapping[n:bs].fill_(-1)
                self.decode_order[n:bs].copy_(self.row_ids[n:bs])
        else:
            self.slot_mapping[t : bs * mean_len].fill_(-1)
            self.query_start_loc[: n + 1].copy_(meta.query_start_loc)
            self.query_start_loc[n + 1 : bs + 1].fill_(t)
        if groups is not None:
            g = groups.rows.shape[0]
            self.group_rows[:g].copy_(groups.rows)
            self.group_rows[g:].fill_(-1)
            self.prefix_lens[:g].copy_(groups.prefix_lens)
            self.prefix_lens[g:].fill_(0)
            self.key_start[:n].copy_(groups.key_start)
            self.key_start[n:bs].fill_(0)
        grouped = groups is not None
        if self.device.type == "cuda":
            self.graphs[bs, mean_len, splits, grouped].replay()
        else:  # the same static-buffer path, run eagerly (tests the layout on the CPU)
            self._run(bs, mean_len, splits, grouped)
        self.last_key = (bs, mean_len, splits, grouped)
        return self.logits[:t]
