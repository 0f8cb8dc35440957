# Draft-model proposer: a smaller model of the same vocabulary proposes k tokens
# autoregressively; the target verifies them in one pass (spec/verify.py).
#
# KV layout: the draft has its OWN cache tensor with the target's block_size and num_blocks,
# and uses the target's block ids, block tables and slot mapping. A token's draft K/V therefore
# live at the same slot as its target K/V, in the other tensor; the pool is sized for both
# (kv_cache.num_blocks_from_budget gets the draft's bytes per block).
# Sync: the draft runs over every prefill chunk and over whole batches that verify drafts, so
# its cache holds every prompt token the target's does (blocks shared through the prefix cache
# included). Decode steps that verify nothing (speculation gated off at high load, or nobody
# drafting) skip it, so the draft costs nothing when it is not used; each decode it skipped
# records the first position missing (Request.draft_lag), and before such a request drafts
# again catch_up() recomputes the gap (normally the few tokens decoded while gated) in one
# chunked prefill over the draft. A block holding generated tokens that is later shared
# through the prefix cache may carry stale draft K/V: that lowers the sharer's acceptance,
# never its output (verification decides every token).
# Proposing (after scheduling, when the slots exist): pass j feeds one token per request at
# position num_tokens - 1 + j (the pending token, then the drafts so far). Its K/V writes
# land at or past num_computed_tokens, in the request's own unpublished blocks, where the
# target's next pass overwrites them anyway. The passes chain on the device; the drafts cross
# to the host in one copy at the end.
# On CUDA the draft's forward over the target's batch is captured inside the runner's step
# graphs, and the greedy proposal chain (k passes) is one captured graph per batch size
# (draft_graphs.py); sampled requests and batches the graphs do not cover run eagerly.
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.core.kv_cache import allocate_kv_caches, bytes_per_block
from engine.core.request import Request
from engine.models.config import PRESETS, ModelConfig, resolve_model_config
from engine.models.loader import build_model
from engine.models.rope import cos_sin_cache
from engine.runner.attention import AttentionMetadata


class DraftProposer:
    per_step_cost = True  # its passes cost about the same for one drafting request or all

    def __init__(
        self,
        draft_model: str,
        target_config: ModelConfig,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        seed: int,
    ) -> None:
        self.model_config = resolve_model_config(draft_model)
        if self.model_config.vocab_size != target_config.vocab_size:
            raise ValueError(
                f"draft model vocabulary ({self.model_config.vocab_size}) differs from the "
                f"target's ({target_config.vocab_size}); drafts must be target token ids"
            )
        checkpoint = None if str(draft_model) in PRESETS else Path(draft_model)
        self.model = build_model(self.model_config, dtype, device, checkpoint, seed)
        self.cos_sin = cos_sin_cache(self.model_config, max_model_len, device)
        self.block_size = block_size
        self.device = device
        self.dtype = dtype
        self.kv_caches: torch.Tensor | None = None
        # Bench/test hook: each draft token is replaced by a random other token with this
        # probability, to dial in an acceptance rate (a draft equal to the target accepts ~all).
        self.corrupt_fraction = 0.0
        self.graphs = None  # DraftChainGraphs once captured (CUDA)
        self._rng = np.random.default_rng(seed)

    def bytes_per_block(self) -> int:
        return bytes_per_block(self.model_config, self.block_size, self.dtype)

    def allocate(self, num_blocks: int) -> None:
        self.kv_caches = allocate_kv_caches(
            self.model_config, num_blocks, self.block_size, self.dtype, self.device
        )

    @torch.inference_mode()
    def forward(self, input_ids, positions, meta: AttentionMetadata) -> None:
        """Write the draft's K/V for the target's batch (the sync invariant)."""
        self.model(input_ids, positions, meta, self.kv_caches, self.cos_sin)

    def plan(self, requests: list[Request]) -> None:
        pass  # needs the slots the scheduler reserves: proposes in propose()

    def capture_graphs(self, k: int, max_num_seqs: int, max_model_len: int, pool=None):
        from engine.spec.draft_graphs import DraftChainGraphs

        self.graphs = DraftChainGraphs(self, k, max_num_seqs, max_model_len)
        return self.graphs.capture(pool)

    def draft_pass(
        self,
        j: int,
        ids: torch.Tensor,  # [n] int64: the token each row feeds this pass
        last_pos: torch.Tensor,  # [n] int64: position of each row's pending token
        limit: torch.Tensor,  # [n] int64: drafts wanted per row; rows past theirs idle
        block_tables: torch.Tensor,  # [n, width] int32
        query_start: torch.Tensor,  # [n + 1] int32 (arange)
        max_seq_len: int,
        num_splits: int | None = None,
    ) -> torch.Tensor:
        """Pass j of the proposal chain: the draft's logits [n, vocab] for draft j + 1. Only
        device ops, so the chain can be graph-captured."""
        bs = self.block_size
        # Rows past their own slot count idle at their last real position, writing nothing.
        active = j < limit
        pos = torch.where(active, last_pos + j, last_pos)
        block = block_tables.gather(1, (pos // bs).unsqueeze(1)).squeeze(1)
        slots = torch.where(active, block.long() * bs + pos % bs, -1)
        meta = AttentionMetadata(
            slot_mapping=slots, block_tables=block_tables,
            seq_lens=(pos + 1).to(torch.int32), query_start_loc=query_start,
            num_decodes=ids.shape[0], max_query_len=1, max_seq_len=max_seq_len,
            max_decode_seq_len=max_seq_len, decode_num_splits=num_splits,
        )  # fmt: skip
        hidden = self.model(ids, pos, meta, self.kv_caches, self.cos_sin)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def propose(self, requests: list[Request]) -> None:
        """requests: decodes granted spec_slots draft slots each; fills spec_token_ids (and
        spec_draft_probs for sampled requests)."""
        self.catch_up([r for r in requests if r.draft_lag is not None])
        num_slots = [r.spec_slots for r in requests]
        sampled_rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        q_all = None
        if not sampled_rows and self.graphs is not None and self.graphs.can_run(requests):
            table = self.graphs.run(requests)  # [n, k] greedy drafts, captured chain
        else:
            table, q_all = self._propose_eager(requests, sampled_rows)
        for i, r in enumerate(requests):
            r.spec_token_ids = table[i][: num_slots[i]]
        for row, i in enumerate(sampled_rows):
            requests[i].spec_draft_probs = q_all[row, : num_slots[i]]
        if self.corrupt_fraction > 0:
            self._corrupt(requests)

    @torch.inference_mode()
    def catch_up(self, requests: list[Request], max_tokens_per_pass: int = 8192) -> None:
        """Write the draft's K/V for positions [draft_lag, num_tokens - 1) of each request
        (the pending token's own K/V come from the first proposal pass), in passes of at most
        max_tokens_per_pass tokens; a long gap is split across passes like chunked prefill."""
        pieces: list[tuple[Request, int, int]] = []  # (request, start, end) positions
        for r in requests:
            start, end = r.draft_lag, r.num_tokens - 1
            r.draft_lag = None
            while start < end:
                step = min(end - start, max_tokens_per_pass)
                pieces.append((r, start, start + step))
                start += step
        chunk: list[tuple[Request, int, int]] = []
        used = 0
        for piece in pieces:
            n = piece[2] - piece[1]
            if chunk and used + n > max_tokens_per_pass:
                self._prefill(chunk)
                chunk, used = [], 0
            chunk.append(piece)
            used += n
        if chunk:
            self._prefill(chunk)

    def _prefill(self, pieces: list[tuple[Request, int, int]]) -> None:
        bs, dev = self.block_size, self.device
        width = max(len(r.block_ids) for r, _, _ in pieces)
        tables = np.zeros((len(pieces), width), dtype=np.int32)
        ids, pos, slots, qsl, lens = [], [], [], [0], []
        for i, (r, start, end) in enumerate(pieces):
            tables[i, : len(r.block_ids)] = r.block_ids
            p = np.arange(start, end)
            ids.extend(r.token_ids[start:end])
            pos.append(p)
            slots.append(np.asarray(r.block_ids)[p // bs] * bs + p % bs)
            qsl.append(qsl[-1] + end - start)
            lens.append(end)
        qsl_t = torch.tensor(qsl, dtype=torch.int32, device=dev)
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(np.concatenate(slots)).to(dev),
            block_tables=torch.from_numpy(tables).to(dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            query_start_loc=qsl_t, num_decodes=0,
            max_query_len=max(e - s for _, s, e in pieces), max_seq_len=max(lens),
            prefill_query_start_loc=qsl_t,
        )  # fmt: skip
        positions = torch.from_numpy(np.concatenate(pos)).to(dev)
        self.model(torch.tensor(ids, device=dev), positions, meta, self.kv_caches, self.cos_sin)

    def _propose_eager(self, requests: list[Request], sampled_rows: list[int]):
        dev = self.device
        n = len(requests)
        num_slots = [r.spec_slots for r in requests]
        k = max(num_slots)
        width = max(len(r.block_ids) for r in requests)
        tables = np.zeros((n, width), dtype=np.int32)
        for i, r in enumerate(requests):
            tables[i, : len(r.block_ids)] = r.block_ids
        block_tables = torch.from_numpy(tables).to(dev)  # [n, width]
        last_pos = torch.tensor([r.num_tokens - 1 for r in requests], device=dev)  # [n]
        limit = torch.tensor(num_slots, device=dev)
        ids = torch.tensor([r.token_ids[-1] for r in requests], device=dev)  # [n]
        query_start = torch.arange(n + 1, dtype=torch.int32, device=dev)
        # Longest context a pass attends to: the pending token plus the drafts before it.
        max_seq_len = max(r.num_tokens + s - 1 for r, s in zip(requests, num_slots))
        temps = torch.tensor(
            [requests[i].params.temperature for i in sampled_rows], device=dev
        ).unsqueeze(1)
        for i in sampled_rows:
            r = requests[i]
            if r.spec_generator is None and r.params.seed is not None:
                seed = (r.params.seed + 1) % 2**63  # not the target's stream
                r.spec_generator = torch.Generator(device=dev).manual_seed(seed)
        drafts: list[torch.Tensor] = []  # k × [n]
        probs: list[torch.Tensor] = []  # k × [len(sampled_rows), vocab]
        for j in range(k):
            logits = self.draft_pass(j, ids, last_pos, limit, block_tables, query_start,
                                     max_seq_len)  # fmt: skip
            ids = logits.argmax(dim=-1)
            if sampled_rows:
                # Sampled requests draw from the draft's own tempered distribution q, which
                # the verifier needs for the acceptance ratio p/q.
                q = torch.softmax(logits[sampled_rows] / temps, dim=-1)
                noise = torch.empty_like(q).exponential_()
                for row, i in enumerate(sampled_rows):
                    gen = requests[i].spec_generator
                    if gen is not None:
                        noise[row].exponential_(generator=gen)
                ids = ids.index_copy(0, torch.tensor(sampled_rows, device=dev),
                                     (q / noise).argmax(dim=-1))  # fmt: skip
                probs.append(q)
            drafts.append(ids)
        table = torch.stack(drafts, dim=1).tolist()  # [n, k]: the one D2H copy
        q_all = torch.stack(probs, dim=1) if probs else None  # [len(sampled_rows), k, vocab]
        return table, q_all

    def _corrupt(self, requests: list[Request]) -> None:
        vocab = self.model_config.vocab_size
        for r in requests:
            hit = self._rng.random(len(r.spec_token_ids)) < self.corrupt_fraction
            if hit.any():
                shift = self._rng.integers(1, vocab, size=len(r.spec_token_ids))
                r.spec_token_ids = [
                    (t + int(s)) % vocab if h else t
                    for t, h, s in zip(r.spec_token_ids, hit, shift)
                ]
                r.spec_draft_probs = None  # q no longer describes them: verify as point masses
