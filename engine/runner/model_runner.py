# Turns a SchedulerOutput into one forward pass: packs the step's tokens, positions, slot
# mapping and block tables, runs the model, computes logits only at positions that sample,
# samples on the device and copies the sampled ids to the host once.
# Tensor parallel: every rank has a runner over its shard of the model and its own KV pool
# (its KV heads, the same blocks). Rank 0's runner broadcasts each step's packed batch before
# launching it; the other ranks' runners sit in follow(), building the identical device batch
# and running the same forward (the same graph replays, the same collectives). Only rank 0
# samples: the logits are gathered to every rank, the others drop them.
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.kv_cache import allocate_kv_caches, num_blocks_from_budget, profile_lengths
from engine.core.prefix_groups import shared_prefix_limits
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.models.config import ModelConfig
from engine.models.loader import build_model
from engine.models.quant_config import fp8_scheme
from engine.models.rope import cos_sin_cache
from engine.parallel.tensor_parallel import SINGLE, TensorParallel
from engine.runner.attention import AttentionMetadata, prefill_tail
from engine.runner.batch_builder import BatchBuilder, PreparedBatch
from engine.runner.cuda_graphs import StepGraphs
from engine.runner.piecewise_graphs import PiecewiseGraphs
from engine.sampling.logprobs import PromptLogprobs, StepLogprobs
from engine.sampling.sampler import HostCopy, SamplingBatch, sample
from engine.spec.draft import DraftProposer
from engine.spec.verify import verify


@dataclass(slots=True)
class StepTiming:
    prepare_s: float = 0.0  # packing the batch, host-to-device copies
    forward_s: float = 0.0  # launching the forward pass (graph replay or eager kernels)
    # Constrained rows (overlapped): waiting for the previous step's ids and feeding the
    # matchers; then filling, uploading and applying the masks (all while the forward runs)
    read_ahead_s: float = 0.0
    masks_s: float = 0.0
    sample_s: float = 0.0  # launching sampling and the device-to-host copy
    wait_s: float = 0.0  # collect(): waiting for the device to finish the step
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
        tp: TensorParallel = SINGLE,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.device = device
        self.dtype = dtype
        self.tp = tp
        self.block_size = config.block_size
        fp8 = fp8_scheme(config.quantization, model_config.quantization_config)
        self.model = build_model(model_config, dtype, device, checkpoint, config.seed, tp, fp8)
        self.shape = self.model.config  # this rank's heads, KV heads and MLP width
        # The KV cache: the model dtype, or e4m3 (half the bytes: twice the tokens per GiB).
        self.kv_dtype = torch.float8_e4m3fn if config.kv_cache_dtype == "fp8" else dtype
        self.cos_sin = cos_sin_cache(model_config, max_model_len, device)
        self.max_model_len = max_model_len
        # The draft model's weights load before the pool is sized, so the budget sees them.
        self.draft: DraftProposer | None = None
        if config.speculative_method == "draft":
            self.draft = DraftProposer(
                config.draft_model, model_config, self.block_size, device, dtype,
                max_model_len, config.seed,
            )  # fmt: skip
        activation_peak = self._profile_activation_peak() if device.type == "cuda" else 0
        num_blocks = num_blocks_from_budget(
            config, self.shape, self.kv_dtype, device, activation_peak,
            self.draft.bytes_per_block() if self.draft is not None else 0,
        )  # fmt: skip
        self.num_blocks = tp.min_int(num_blocks)  # one block table serves every rank's pool
        self.kv_caches = allocate_kv_caches(
            self.shape, self.num_blocks, self.block_size, self.kv_dtype, device
        )
        if self.draft is not None:
            self.draft.allocate(self.num_blocks)
        self.eos_token_ids: tuple[int, ...] = model_config.eos_token_ids
        self.timing = StepTiming()
        prefill_split = None
        if config.prefill_split_keys and device.type == "cuda":
            num_sms = torch.cuda.get_device_properties(device).multi_processor_count
            prefill_split = (self.shape.num_heads // self.shape.num_kv_heads, num_sms)
        self.batch_builder = BatchBuilder(
            self.block_size,
            device,
            self.shape.num_kv_heads,
            shared_prefix_limits(config),
            prefill_split,
        )
        self.graphs: StepGraphs | None = None  # pure-decode steps
        self.piecewise: PiecewiseGraphs | None = None  # steps with prompt chunks
        self.verify_graphs: StepGraphs | None = None  # decodes with drafts (speculation on)
        # Benchmarks set a list here to collect (start, end) CUDA events of every step.
        self.step_events: list | None = None
        self._step_start = None  # the open step's start event (begin_step), when collecting
        self.warmup_report: dict | None = None  # kernel_warmup.warm_up_mixed_steps, once run
        # Made by the engine when its first constrained request is admitted.
        self.grammar_masks = (
            None  # engine.sampling.grammar_mask.GrammarMasks once a grammar is used
        )

    # -- the step ------------------------------------------------------------------------

    def execute(self, out: SchedulerOutput) -> list:
        """One entry per sampling request: a token id, or (when the batch verifies drafts) a
        list of accepted drafts + one target token."""
        return self.collect(self.launch(out))

    def collect(self, launched: HostCopy) -> list:
        """Wait for a launched step's sampled ids (the step's one device-to-host copy)."""
        t0 = time.perf_counter()
        result = launched.wait()
        if launched.logprobs is not None:
            launched.logprobs.record(result)
        if launched.prompt_logprobs is not None:
            launched.prompt_logprobs.record()
        self.timing.wait_s = time.perf_counter() - t0
        return result

    @torch.inference_mode()
    def launch(
        self,
        out: SchedulerOutput,
        feed_rows: dict[Request, int] | None = None,
        feed_ids: torch.Tensor | None = None,
        before_masks: Callable[[], None] | None = None,
    ) -> HostCopy:
        """Queue the step's device work (forward, sampling, the copy of the sampled ids) and
        return without waiting for it, so the caller can do host work meanwhile; collect()
        brings the result. Verify steps (speculation) still finish here. Overlapped scheduling:
        a request whose last token is PENDING_TOKEN reads it from `feed_ids` (the previous
        step's sampled ids [rows] on the device) at its row `feed_rows[request]`, and
        `before_masks` runs once the forward pass is queued, before the grammar masks are
        filled (it brings the constrained rows' last tokens to their matchers)."""
        t0 = time.perf_counter()
        packed = self.batch_builder.pack(out, feed_rows)
        if self.tp.size > 1:
            self.tp.broadcast(packed.for_followers())  # the other ranks start the same step
        batch = self.batch_builder.to_device(packed)
        sampling = self._sampling_batch(batch.sampling_requests, batch.has_drafts)
        if self._step_start is None:
            self.begin_step()  # after the host's packing: the interval is the device's work
        if batch.fed_rows is not None:
            # Stream order makes this read the previous step's sampled ids once they exist;
            # graph replays copy input_ids into their static buffer after this.
            fed = feed_ids.index_select(0, batch.fed_from)
            batch.input_ids.index_copy_(0, batch.fed_rows, fed)
        t1 = time.perf_counter()
        meta = batch.meta
        prompt = None
        if out.num_decodes < len(out.requests):  # prompt chunks: some may want prompt logprobs
            prompt = PromptLogprobs.plan(out.requests, out.num_new_tokens)
        logits = self._logits(batch, prompt)
        if self.draft is not None and not batch.has_drafts:
            # The draft skipped this step's decodes: their K/V are missing from its cache
            # until a catch-up (DraftProposer.catch_up) before they next draft.
            for r in out.requests[: meta.num_decodes]:
                if r.draft_lag is None or r.num_computed_tokens < r.draft_lag:
                    r.draft_lag = r.num_computed_tokens
        # Before anything changes the logits in place (masks, bans): the model's own logprobs.
        logprobs = StepLogprobs.of(logits, batch.sampling_requests) if sampling else None
        # The forward pass is queued: the host fills the grammar masks while the device runs it.
        t_read = time.perf_counter()
        if before_masks is not None and any(r.grammar is not None for r in batch.sampling_requests):
            before_masks()
        t_masks = time.perf_counter()
        masks = self._grammar_masks(batch.sampling_requests)
        if masks is not None:
            self.grammar_masks.apply(logits, masks)
        t2 = time.perf_counter()
        if batch.has_drafts:
            vocab = self.model_config.vocab_size
            # verify() ends in the step's one D2H copy.
            accepted = verify(logits, batch.sampling_requests, vocab, self.eos_token_ids)
            result = HostCopy(values=accepted, prompt_logprobs=prompt)
            self._record_end()
        elif sampling is not None:
            sampled = sample(logits, sampling)
            if logprobs is not None:
                logprobs.start_copy(sampled)
            self._record_end()
            result = HostCopy.start(sampled)  # the step's one D2H copy (+ logprobs when asked)
            result.logprobs = logprobs
            result.prompt_logprobs = prompt
        else:
            self._record_end()
            result = HostCopy(values=[], prompt_logprobs=prompt)
        t3 = time.perf_counter()
        self.timing = StepTiming(prepare_s=t1 - t0, forward_s=t_read - t1, sample_s=t3 - t2,
                                 read_ahead_s=t_masks - t_read, masks_s=t2 - t_masks)  # fmt: skip
        return result

    def _grammar_masks(self, requests: list[Request]):
        """The bitmask rows of the step's constrained requests (GrammarMasks.fill), or None.
        `requests`: 1 + len(drafts) rows each; a constrained request never drafts."""
        if not any(r.grammar is not None for r in requests):
            return None
        rows = [r for r in requests for _ in range(1 + len(r.spec_token_ids))]
        return self.grammar_masks.fill(rows)

    def _logits(self, batch: PreparedBatch, prompt: PromptLogprobs | None = None) -> torch.Tensor:
        """The step's forward: logits [num_sampling_rows, vocab] (on every rank). `prompt`:
        prompt logprob rows to compute from the hidden states too (prefill steps: never a graph)."""
        graphs = self._graphs_for(batch)
        if graphs is not None:
            return graphs.replay(batch)  # every token samples in these steps
        if self._piecewise_for(batch) is not None:
            hidden = self.piecewise.run(batch)
        else:
            hidden = self._eager_forward(batch)
        if prompt is not None:
            prompt.start(hidden, self.model.compute_logits)
        return self.model.compute_logits(hidden[batch.logits_indices])

    # -- tensor parallel -------------------------------------------------------------------

    @torch.inference_mode()
    def follow(self) -> None:
        """Ranks > 0: run rank 0's steps until it says stop (None)."""
        while (packed := self.tp.broadcast()) is not None:
            self._logits(self.batch_builder.to_device(packed))

    def stop_followers(self) -> None:
        """Rank 0: release the other ranks from follow()."""
        if self.tp.size > 1:
            self.tp.broadcast(None)

    def will_replay(self, out: SchedulerOutput) -> bool:
        """Whether launch(out) replays a captured graph (cheap) rather than launching the
        forward kernel by kernel (host-bound: tens of ms for a large model)."""
        if self.device.type != "cuda" or any(r.spec_token_ids for r in out.requests):
            return False
        graphs, pw = self.graphs, self.piecewise
        if graphs is not None and 0 < len(out.requests) == out.num_decodes <= graphs.max_bs:
            return True
        return pw is not None and pw.can_run(sum(out.num_new_tokens))

    def begin_step(self) -> None:
        """Open the step's GPU interval early (the engine calls this before a draft model
        proposes, so its passes count as the step's GPU work)."""
        if self.step_events is not None:
            self._step_start = torch.cuda.Event(enable_timing=True)
            self._step_start.record()

    def _record_end(self) -> None:
        if self._step_start is not None:
            end_event = torch.cuda.Event(enable_timing=True)
            end_event.record()
            self.step_events.append((self._step_start, end_event))
            self._step_start = None

    def _sampling_batch(self, requests: list[Request], has_drafts: bool) -> SamplingBatch | None:
        if not requests:
            return None
        for r in requests:
            if r.generator is None and r.params.seed is not None and not r.params.greedy:
                r.generator = self._seeded_generator(r)
        if has_drafts:
            return None  # spec/verify.py builds its own per-row batch
        vocab = self.model_config.vocab_size
        return SamplingBatch.from_requests(requests, vocab, self.device, self.eos_token_ids)

    def _seeded_generator(self, request: Request) -> torch.Generator:
        """The request's generator, made when it first samples. Output tokens it already has
        then came from an earlier run of the same request (a worker resuming a stream another
        one started): each took one draw of vocab-size exponential noise from this generator
        (sampler.sample), so re-drawing them puts the stream exactly where that run left it.
        Speculative verification draws differently; a resumed speculative request is not exact."""
        gen = torch.Generator(device=self.device).manual_seed(request.params.seed)
        if request.num_output_tokens:
            scratch = torch.empty(self.model_config.vocab_size, device=self.device)
            for _ in range(request.num_output_tokens):
                scratch.exponential_(generator=gen)
        return gen

    def _forward(self, input_ids, positions, meta) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of the target alone."""
        return self.model(input_ids, positions, meta, self.kv_caches, self.cos_sin)

    def _forward_with_draft(self, input_ids, positions, meta) -> torch.Tensor:
        """Steps that verify drafts: the draft model sees the whole batch too, so its cache
        holds every token the target's does (spec/draft.py)."""
        hidden = self._forward(input_ids, positions, meta)
        self.draft.forward(input_ids, positions, meta)
        return hidden

    def _eager_forward(self, batch) -> torch.Tensor:
        meta = batch.meta
        if self.draft is None:
            return self._forward(batch.input_ids, batch.positions, meta)
        if batch.has_drafts:
            return self._forward_with_draft(batch.input_ids, batch.positions, meta)
        hidden = self._forward(batch.input_ids, batch.positions, meta)
        nd = meta.num_decodes
        if nd < meta.seq_lens.shape[0]:  # prefill chunks: the draft follows every prompt
            self.draft.forward(batch.input_ids[nd:], batch.positions[nd:], prefill_tail(meta))
        return hidden

    def _piecewise_for(self, batch) -> PiecewiseGraphs | None:
        pw = self.piecewise
        if pw is None or batch.has_drafts or not pw.can_run(batch.input_ids.shape[0]):
            return None
        return pw

    def _graphs_for(self, batch) -> StepGraphs | None:
        if batch.has_drafts:
            graphs = self.verify_graphs
        else:
            graphs = self.graphs
        return graphs if graphs is not None and graphs.can_run(batch) else None

    def capture_graphs(self, max_num_seqs: int) -> None:
        """Decode graphs, and with speculation also verify graphs (up to k drafts per
        sequence) and the draft model's proposal chains. One memory pool serves them all:
        steps never overlap."""

        def step_graphs(query_len: int) -> StepGraphs:
            # Decode steps run the target alone; verify steps bring the draft model along.
            forward = self._forward_with_draft if query_len > 1 and self.draft else self._forward
            return StepGraphs(
                forward, self.model.compute_logits,
                vocab_size=self.model_config.vocab_size, model_dtype=self.dtype,
                num_kv_heads=self.shape.num_kv_heads, device=self.device,
                max_num_seqs=max_num_seqs, max_model_len=self.max_model_len,
                block_size=self.block_size, query_len=query_len,
                prefix_groups=self.batch_builder.prefix_groups,
            )  # fmt: skip

        pool = None
        if self.config.speculative_method is not None:
            self.verify_graphs = step_graphs(1 + self.config.num_speculative_tokens)
            pool = self.verify_graphs.capture(pool)
        self.graphs = step_graphs(1)
        pool = self.graphs.capture(pool)
        # Not under tensor parallelism: the followers replay no pieces
        # (engine/parallel/tp_followers.py).
        tp = self.config.tensor_parallel_size
        if self.config.use_piecewise_graphs and self.draft is None and tp == 1:
            self.piecewise = PiecewiseGraphs(
                self.model, self.kv_caches, self.cos_sin, device=self.device, dtype=self.dtype,
                max_tokens=min(self.config.piecewise_max_tokens,
                               self.config.max_num_batched_tokens),
                bucket_step=self.config.piecewise_bucket_step,
            )  # fmt: skip
            pool = self.piecewise.capture(pool)
        if self.draft is not None:
            self.draft.capture_graphs(
                self.config.num_speculative_tokens, max_num_seqs, self.max_model_len, pool
            )

    # -- memory profile ------------------------------------------------------------------

    @torch.inference_mode()
    def _profile_activation_peak(self) -> int:
        """Run a full-budget prefill against a scratch KV cache and measure the activation
        peak, so the pool leaves room for the worst step."""
        lens = profile_lengths(
            self.config.max_num_batched_tokens, self.config.max_num_seqs, self.max_model_len
        )
        num_tokens, num_seqs = sum(lens), len(lens)
        blocks_per_seq = -(-max(lens) // self.block_size)
        num_blocks = num_seqs * blocks_per_seq
        scratch = allocate_kv_caches(
            self.shape, num_blocks, self.block_size, self.kv_dtype, self.device
        )
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
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        hidden = self.model(ids, positions, meta, scratch, self.cos_sin)
        # The most rows a step samples: every sequence, each with its drafts when verifying.
        drafts = self.config.num_speculative_tokens if self.config.speculative_method else 0
        rows = min(num_tokens, self.config.max_num_seqs * (1 + drafts))
        logits = self.model.compute_logits(hidden[-rows:])
        torch.softmax(logits, dim=-1).sort(dim=-1)  # the sampler's worst case (top-p)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del scratch, hidden, logits
        torch.cuda.empty_cache()
        return int(peak)
