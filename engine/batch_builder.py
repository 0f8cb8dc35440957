# Packs one step's scheduled requests into the flat tensors the model and attention need.
# Everything is assembled on the host in two numpy buffers (int64 and int32) and crosses to the
# device in two copies; the tensors handed out are views into those copies.
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from engine.attention import AttentionMetadata
from engine.request import Request
from engine.scheduler import SchedulerOutput


@dataclass(slots=True)
class PreparedBatch:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling_rows] int64: hidden rows that sample
    sampling_requests: list[Request]  # 1 + len(spec_token_ids) rows each, in row order
    has_drafts: bool = False
    seq_lens_host: list[int] = field(default_factory=list)  # meta.seq_lens, on the host


class BatchBuilder:
    def __init__(self, block_size: int, device: torch.device, num_kv_heads: int = 1) -> None:
        self.block_size = block_size
        self.device = device
        self.num_kv_heads = num_kv_heads

    def prepare(self, out: SchedulerOutput) -> PreparedBatch:
        bs = self.block_size
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        query_start = [0]
        logits_indices: list[int] = []
        sampling: list[Request] = []
        max_blocks = 1
        for request, n in zip(out.requests, out.num_new_tokens):
            start = request.num_computed_tokens
            end = start + n
            ids = request.block_ids
            # Drafts ride after the pending token at positions num_tokens, ... like a short
            # prefill chunk (their slots were reserved by the scheduler).
            num_drafts = len(request.spec_token_ids)
            if n == 1:
                tokens.append(request.token_ids[start])
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

        i64 = self._to_device(np.array(tokens + positions + slots + logits_indices, dtype=np.int64))
        header = np.array(seq_lens + query_start + prefill_qsl, dtype=np.int32)
        i32 = self._to_device(np.concatenate((header, block_tables.ravel())))
        t = num_tokens
        s = num_seqs
        meta = AttentionMetadata(
            slot_mapping=i64[2 * t : 3 * t],
            block_tables=i32[2 * s + 1 + len(prefill_qsl) :].view(num_seqs, max_blocks),
            seq_lens=i32[:s],
            query_start_loc=i32[s : 2 * s + 1],
            num_decodes=nd,
            max_query_len=max(out.num_new_tokens),
            max_seq_len=max(seq_lens),
            prefill_query_start_loc=i32[2 * s + 1 : 2 * s + 1 + len(prefill_qsl)],
            max_decode_seq_len=max(seq_lens[:nd], default=0),
            decode_num_splits=self._decode_splits(seq_lens[:nd]),
        )
        return PreparedBatch(
            input_ids=i64[:t],
            positions=i64[t : 2 * t],
            meta=meta,
            logits_indices=i64[3 * t :],
            sampling_requests=sampling,
            has_drafts=len(logits_indices) > len(sampling),
            seq_lens_host=seq_lens,
        )

    def _decode_splits(self, decode_lens: list[int]) -> int | None:
        """Eager steps' decode split count, balanced for rows of mixed lengths (the kernel's
        own choice sees only the longest row). The CPU path does not split."""
        if self.device.type != "cuda" or not decode_lens:
            return None
        from kernels._launch import num_sms
        from kernels.paged_decode_attention import balanced_num_splits

        return balanced_num_splits(decode_lens, self.num_kv_heads, num_sms(self.device))

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(array)
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)
