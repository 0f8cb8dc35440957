# Packs one step's scheduled requests into the flat tensors the model and attention need.
# Everything is assembled on the host in two numpy buffers (int64 and int32) and crosses to the
# device in two copies; the tensors handed out are views into those copies. The packed host
# form (PackedBatch) is also the step that tensor-parallel rank 0 broadcasts to the others:
# every rank builds the identical device batch from it.
# Overlapped scheduling: a decode whose input token is still on the device (PENDING_TOKEN) is
# packed with a placeholder id and a (row in this batch, row in the previous step's sampled
# ids) pair; the runner fills the real id in on the device before the forward.
# Shared-prefix decode (prefix_groups set): the decode rows sharing prefix-cache blocks are
# grouped on the host (engine/core/prefix_groups.py) and the groups ride in the same int32 copy.
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from engine.core.prefix_groups import PrefixGroupLimits, find_prefix_groups
from engine.core.request import PENDING_TOKEN, Request
from engine.core.scheduler import SchedulerOutput
from engine.runner.attention import AttentionMetadata


@dataclass(slots=True)
class PreparedBatch:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling_rows] int64: hidden rows that sample
    sampling_requests: list[Request]  # 1 + len(spec_token_ids) rows each, in row order
    has_drafts: bool = False
    seq_lens_host: list[int] = field(default_factory=list)  # meta.seq_lens, on the host
    # [num_fed] int64 each: input_ids[fed_rows] come from the previous step's sampled[fed_from]
    fed_rows: torch.Tensor | None = None
    fed_from: torch.Tensor | None = None


@dataclass(slots=True)
class PackedBatch:
    # i64: input_ids, positions, slot_mapping (num_tokens each), logits_indices, then the fed
    # rows and the previous step's rows they read (num_fed each)
    i64: np.ndarray
    # i32: seq_lens [num_seqs], query_start_loc [num_seqs + 1], the prefill tail's re-based
    # query_start_loc [num_seqs - num_decodes + 1], block_tables [num_seqs, max_blocks], then
    # the decode rows longest context first [num_decodes], then with prefix groups their
    # rows [groups, rows_per_group], prefix_lens [groups] and key_start [num_decodes]
    i32: np.ndarray
    num_tokens: int
    num_seqs: int
    max_blocks: int
    num_decodes: int
    max_query_len: int
    has_drafts: bool
    decode_num_splits: int | None
    num_fed: int = 0
    prefix_groups: tuple[int, int] | None = None  # (groups, rows per group) in i32's tail
    decode_prefix_splits: int = 1
    prefill_num_splits: int = 1  # key ranges of the prompt chunks' attention
    # Rank 0 only (host objects the sampler reads); never sent to the other ranks.
    sampling_requests: list[Request] = field(default_factory=list)

    def for_followers(self) -> PackedBatch:
        return replace(self, sampling_requests=[])


class BatchBuilder:
    def __init__(
        self,
        block_size: int,
        device: torch.device,
        num_kv_heads: int = 1,
        prefix_groups: PrefixGroupLimits | None = None,
        prefill_split: tuple[int, int] | None = None,
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.num_kv_heads = num_kv_heads
        self.prefix_groups = prefix_groups  # None: shared-prefix decode off
        # (query heads per KV head, SMs): the prefill attention's key splits; None: one range
        self.prefill_split = prefill_split
        if prefill_split is not None:  # resolved once, not in every step's pack
            from kernels.paged_prefill_attention import prefill_num_splits

            self._prefill_num_splits = prefill_num_splits

    def prepare(self, out: SchedulerOutput) -> PreparedBatch:
        return self.to_device(self.pack(out))

    def pack(self, out: SchedulerOutput, feed: dict[Request, int] | None = None) -> PackedBatch:
        """The step on the host: what tensor-parallel rank 0 sends every other rank. `feed`:
        the row of each request in the previous step's sampled ids, for PENDING_TOKEN inputs."""
        bs = self.block_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        query_start = [0]
        logits_indices: list[int] = []
        sampling: list[Request] = []
        fed_rows: list[int] = []
        fed_from: list[int] = []
        max_blocks = 1
        for request, n in zip(out.requests, out.num_new_tokens):
            start = request.num_computed_tokens
            end = start + n
            ids = request.block_ids
            # Drafts ride after the pending token at positions num_tokens, ... like a short
            # prefill chunk (their slots were reserved by the scheduler).
            num_drafts = len(request.spec_token_ids)
            if n == 1:
                token = request.token_ids[start]
                if token == PENDING_TOKEN:
                    fed_rows.append(len(tokens))
                    fed_from.append(feed[request])
                    token = 0  # overwritten on the device
                tokens.append(token)
                positions.append(start)
                slots.append(ids[start // bs] * bs + start % bs)
            else:
                tokens.extend(request.token_ids[start : end - num_drafts])
                tokens.extend(request.spec_token_ids)
                pos = np.arange(start, end)
                positions.extend(pos.tolist())
                slots.extend((np.asarray(ids)[pos // bs] * bs + pos % bs).tolist())
            seq_lens.append(end)
            query_start.append(query_start[-1] + n)
            max_blocks = max(max_blocks, len(ids))
            if end - num_drafts == request.num_tokens:
                # Rows that sample: the last one, or all 1 + num_drafts when verifying.
                if num_drafts:
                    logits_indices.extend(range(query_start[-1] - 1 - num_drafts, query_start[-1]))
                else:
                    logits_indices.append(query_start[-1] - 1)
                sampling.append(request)

        num_seqs, num_tokens = len(out.requests), len(tokens)
        block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
        for row, request in enumerate(out.requests):
            ids = request.block_ids
            cache = request.block_table_cache
            if cache is None or cache[0] is not ids or cache[1] != len(ids):
                cache = (ids, len(ids), np.array(ids, dtype=np.int32))
                request.block_table_cache = cache
            block_tables[row, : cache[1]] = cache[2]
        nd = out.num_decodes
        prefill_qsl = [q - query_start[nd] for q in query_start[nd:]]
        header = np.array(seq_lens + query_start + prefill_qsl, dtype=np.int32)
        decode_order = np.argsort(-header[:nd], kind="stable").astype(np.int32)
        parts = [header, block_tables.ravel(), decode_order]
        groups, splits, prefix_splits = None, None, 1
        if self.prefix_groups is not None and nd >= 2:
            found = find_prefix_groups(
                block_tables[:nd], header[:nd], bs, **asdict(self.prefix_groups)
            ).trimmed()
            if found.num_groups:
                groups = found.rows.shape
                parts += [found.rows.ravel(), found.prefix_lens, found.key_start]
                splits = self.decode_splits((header[:nd] - found.key_start).tolist())
                prefix_splits = self._prefix_splits(found.num_groups, int(found.prefix_lens.max()))
        if groups is None:
            splits = self.decode_splits(seq_lens[:nd])
        prefill_splits = 1
        if self.prefill_split is not None and nd < num_seqs:
            group, num_sms = self.prefill_split
            prefill_splits = self._prefill_num_splits(
                num_seqs - nd, max(out.num_new_tokens[nd:]), max(seq_lens[nd:]), group,
                self.num_kv_heads, num_sms,
            )  # fmt: skip
        return PackedBatch(
            i64=np.array(
                tokens + positions + slots + logits_indices + fed_rows + fed_from, dtype=np.int64
            ),
            i32=np.concatenate(parts),
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_blocks=max_blocks,
            num_decodes=nd,
            max_query_len=max(out.num_new_tokens),
            has_drafts=len(logits_indices) > len(sampling),
            decode_num_splits=splits,
            sampling_requests=sampling,
            num_fed=len(fed_rows),
            prefix_groups=groups,
            decode_prefix_splits=prefix_splits,
            prefill_num_splits=prefill_splits,
        )

    def to_device(self, packed: PackedBatch) -> PreparedBatch:
        """The packed arrays on the device (two copies) and the views the step reads."""
        t, s, nd, f = packed.num_tokens, packed.num_seqs, packed.num_decodes, packed.num_fed
        seq_lens = packed.i32[:s].tolist()
        i64 = self._to_device(packed.i64)
        i32 = self._to_device(packed.i32)
        num_prefill_qsl = s - nd + 1
        tables_at = 2 * s + 1 + num_prefill_qsl
        order_at = tables_at + s * packed.max_blocks
        groups_at = order_at + nd
        meta = AttentionMetadata(
            slot_mapping=i64[2 * t : 3 * t],
            block_tables=i32[tables_at:order_at].view(s, packed.max_blocks),
            seq_lens=i32[:s],
            query_start_loc=i32[s : 2 * s + 1],
            num_decodes=nd,
            max_query_len=packed.max_query_len,
            max_seq_len=max(seq_lens),
            prefill_query_start_loc=i32[2 * s + 1 : 2 * s + 1 + num_prefill_qsl],
            max_decode_seq_len=max(seq_lens[:nd], default=0),
            decode_num_splits=packed.decode_num_splits,
            decode_order=i32[order_at:groups_at] if nd else None,
            prefill_num_splits=packed.prefill_num_splits,
        )
        if packed.prefix_groups is not None:
            from kernels.shared_prefix_decode import PrefixGroups

            g, r = packed.prefix_groups
            rows_end = groups_at + g * r
            meta.decode_prefix_groups = PrefixGroups(
                rows=i32[groups_at:rows_end].view(g, r),
                prefix_lens=i32[rows_end : rows_end + g],
                key_start=i32[rows_end + g : rows_end + g + nd],
            )
            meta.decode_prefix_splits = packed.decode_prefix_splits
        end = i64.shape[0] - 2 * f  # logits_indices end where the fed rows begin
        return PreparedBatch(
            input_ids=i64[:t],
            positions=i64[t : 2 * t],
            meta=meta,
            logits_indices=i64[3 * t : end],
            sampling_requests=packed.sampling_requests,
            has_drafts=packed.has_drafts,
            seq_lens_host=seq_lens,
            fed_rows=i64[end : end + f] if f else None,
            fed_from=i64[end + f :] if f else None,
        )

    def decode_splits(self, decode_lens: list[int]) -> int | None:
        """Eager steps' decode split count, balanced for rows of mixed lengths (the kernel's
        own choice sees only the longest row). The CPU path does not split."""
        if self.device.type != "cuda" or not decode_lens:
            return None
        from kernels._launch import num_sms
        from kernels.paged_decode_attention import balanced_num_splits

        return balanced_num_splits(decode_lens, self.num_kv_heads, num_sms(self.device))

    def _prefix_splits(self, num_groups: int, longest_prefix: int) -> int:
        """Splits of each group's prefix: enough (KV head, group, split) programs to fill the
        GPU, each >= MIN_KEYS_PER_SPLIT keys (choose_num_splits' rule). 1 on the CPU."""
        if self.device.type != "cuda":
            return 1
        from kernels._launch import num_sms
        from kernels.paged_decode_attention import choose_num_splits

        return choose_num_splits(
            num_groups, self.num_kv_heads, longest_prefix, num_sms(self.device)
        )

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(array)
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)
