# Turns a SchedulerOutput into one forward pass: packs the step's tokens, positions, slot
# mapping and block tables, runs the model, computes logits only at positions that sample,
# samples on the device and copies the sampled ids to the host once.
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.attention import AttentionMetadata
from engine.batch_builder import BatchBuilder
from engine.config import EngineConfig
from engine.kv_cache import allocate_kv_caches, num_blocks_from_budget
from engine.models.config import ModelConfig
from engine.models.loader import build_model
from engine.models.rope import cos_sin_cache
from engine.request import Request
from engine.sampler import SamplingBatch, sample
from engine.scheduler import SchedulerOutput


@dataclass(slots=True)
class StepTiming:
    prepare_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        checkpoint,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.device = device
        self.dtype = dtype
        self.block_size = config.block_size
        self.model = build_model(model_config, dtype, device, checkpoint, config.seed)
        self.cos_sin = cos_sin_cache(model_config, max_model_len, device)
        self.max_model_len = max_model_len
        activation_peak = self._profile_activation_peak() if device.type == "cuda" else 0
        self.num_blocks = num_blocks_from_budget(
            config, model_config, dtype, device, activation_peak
        )
        self.kv_caches = allocate_kv_caches(
            model_config, self.num_blocks, self.block_size, dtype, device
        )
        self.eos_token_ids: tuple[int, ...] = model_config.eos_token_ids
        self.timing = StepTiming()
        self.batch_builder = BatchBuilder(self.block_size, device)

    # -- the step ------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> list[int]:
        t0 = time.perf_counter()
        batch = self.batch_builder.prepare(out)
        t1 = time.perf_counter()
        hidden = self.model(
            batch.input_ids, batch.positions, batch.meta, self.kv_caches, self.cos_sin
        )
        logits = self.model.compute_logits(hidden[batch.logits_indices])
        t2 = time.perf_counter()
        token_ids = self.sample(logits, batch.sampling_requests)
        t3 = time.perf_counter()
        self.timing = StepTiming(prepare_s=t1 - t0, forward_s=t2 - t1, sample_s=t3 - t2)
        return token_ids

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        if not requests:
            return []
        for r in requests:
            if r.generator is None and r.params.seed is not None and not r.params.greedy:
                r.generator = torch.Generator(device=self.device).manual_seed(r.params.seed)
        batch = SamplingBatch.from_requests(
            requests, logits.shape[-1], self.device, self.eos_token_ids
        )
        return sample(logits, batch).tolist()  # the step's one device-to-host copy

    # -- memory profile ------------------------------------------------------------------

    @torch.inference_mode()
    def _profile_activation_peak(self) -> int:
        """Run a full-budget prefill against a scratch KV cache and measure the activation
        peak, so the pool leaves room for the worst step."""
        num_tokens = min(self.config.max_num_batched_tokens, self.max_model_len)
        num_seqs = max(1, min(self.config.max_num_seqs, num_tokens))
        num_blocks = num_seqs * (-(-num_tokens // num_seqs // self.block_size) + 1)
        scratch = allocate_kv_caches(
            self.model_config, num_blocks, self.block_size, self.dtype, self.device
        )
        per_seq = num_tokens // num_seqs
        lens = [per_seq] * num_seqs
        lens[-1] += num_tokens - per_seq * num_seqs
        blocks_per_seq = num_blocks // num_seqs
        tables = torch.arange(num_blocks, dtype=torch.int32, device=self.device).view(num_seqs, -1)
        qsl = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32, device=self.device)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lens])
        slots = torch.cat(
            [tables[i].long().repeat_interleave(self.block_size)[: lens[i]] * self.block_size
             + torch.arange(lens[i], device=self.device) % self.block_size for i in range(num_seqs)]
        )  # fmt: skip
        meta = AttentionMetadata(
            slot_mapping=slots, block_tables=tables,
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=self.device),
            query_start_loc=qsl, num_decodes=0, max_query_len=max(lens), max_seq_len=max(lens),
            prefill_query_start_loc=qsl,
        )  # fmt: skip
        assert blocks_per_seq * self.block_size >= max(lens)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        hidden = self.model(ids, positions, meta, scratch, self.cos_sin)
        logits = self.model.compute_logits(hidden[-num_seqs:])
        torch.softmax(logits, dim=-1).sort(dim=-1)  # the sampler's worst case (top-p)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del scratch, hidden, logits
        torch.cuda.empty_cache()
        return int(peak)
