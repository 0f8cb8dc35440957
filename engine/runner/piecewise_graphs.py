# CUDA graphs for steps that carry prompt chunks (mixed steps). Such a step cannot be one graph:
# attention's work depends on every sequence's query and context lengths. The rest of a layer
# depends only on the number of tokens, so the forward is captured in pieces per token-count
# bucket T:
#   piece 0      embedding + layer 0 up to attention
#   piece i      layer i-1 after attention + layer i up to attention      (1 <= i < L)
#   piece L      layer L-1 after attention + the final norm
# A step pads its tokens up to a bucket, replays piece 0, then per layer launches attention on
# the real tokens (rotary + the cache write in one kernel, then attention's few) and replays the
# next piece: L + 1 replays and L attention
# launches instead of every layer's ~15 kernels launched from Python (~25 ms for the 8B on the
# H200's host, the GPU idle meanwhile).
#
# Static buffers per bucket T, shared by that bucket's pieces (graphs read and write only these,
# so the pieces chain through them):
#   input_ids, positions: [T]; q: [T, H, D]; k, v: [T, Hkv, D]; attn: [T, H, D];
#   residual, hidden: [T, hidden]
# Rows past the real tokens carry token 0 at position 0; attention's metadata covers only the
# real tokens and rows never mix outside attention, so padding reaches no real row.
from __future__ import annotations

import torch

from engine.runner.cuda_graphs import capture_graph

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def bucket_ladder(max_tokens: int, step: int = 0) -> list[int]:
    """Token counts to capture pieces at, ascending, the last one max_tokens. step 0: powers of
    two from 16; step N (a power of two): powers of two up to N, then every multiple of N. A
    step pads its tokens to the next bucket and its matmuls pay for the padding rows: on the
    H200, 136 decodes + a 512-token prompt padded to 1,024 took 32.9 ms of GPU time where
    the decodes alone took 15.2 (docs/benchmarks-log.md)."""
    if max_tokens < 1 or step < 0 or step & (step - 1):
        raise ValueError("need max_tokens >= 1 and a step that is 0 or a power of two")
    small = [b for b in DEFAULT_BUCKETS if b < min(max_tokens, step or max_tokens)]
    steps = range(step, max_tokens, step) if step else ()
    return [*small, *steps, max_tokens]


class PiecewiseGraphs:
    def __init__(
        self,
        model,
        kv_caches: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, dim]
        cos_sin: torch.Tensor,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_tokens: int,
        bucket_step: int = 0,  # bucket_ladder's step
    ) -> None:
        self.model = model
        self.layers = model.model.layers
        self.kv_caches = kv_caches
        self.cos_sin = cos_sin
        self.device = device
        self.buckets = bucket_ladder(max_tokens, bucket_step)
        c = model.config
        t, d = self.buckets[-1], device
        # One set of buffers at the largest bucket; a bucket uses their first T rows.
        self.input_ids = torch.zeros(t, dtype=torch.int64, device=d)
        self.positions = torch.zeros(t, dtype=torch.int64, device=d)
        self.q = torch.zeros(t, c.num_heads, c.head_dim, dtype=dtype, device=d)
        self.k = torch.zeros(t, c.num_kv_heads, c.head_dim, dtype=dtype, device=d)
        self.v = torch.zeros_like(self.k)
        self.attn = torch.zeros_like(self.q)
        self.residual = torch.zeros(t, c.hidden_size, dtype=dtype, device=d)
        self.hidden = torch.zeros_like(self.residual)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def can_run(self, num_tokens: int) -> bool:
        return 0 < num_tokens <= self.max_tokens

    # -- the pieces ----------------------------------------------------------------------

    def _piece(self, i: int, t: int) -> None:
        """Piece i at bucket size t, reading and writing the static buffers."""
        layers = self.layers
        if i == 0:
            hidden, residual = self.model.model.embed_tokens(self.input_ids[:t]), None
        else:
            hidden, residual = layers[i - 1].after_attention(self.attn[:t], self.residual[:t])
        if i == len(layers):
            hidden, _ = self.model.model.norm(hidden, residual)
            self.hidden[:t].copy_(hidden)
            return
        q, k, v, residual = layers[i].before_attention(hidden, residual)
        self.q[:t].copy_(q)
        self.k[:t].copy_(k)
        self.v[:t].copy_(v)
        self.residual[:t].copy_(residual)

    @torch.inference_mode()
    def capture(self, pool=None):
        """Capture every (bucket, piece) into `pool`; returns the pool for sharing."""
        if self.device.type != "cuda":
            return pool  # run() executes the same pieces eagerly (CPU tests)
        for t in reversed(self.buckets):  # largest first: smaller ones reuse its memory
            for i in range(len(self.layers) + 1):
                self.graphs[t, i], pool = capture_graph(
                    lambda i=i, t=t: self._piece(i, t), self.device, pool
                )
        torch.cuda.synchronize(self.device)
        return pool

    def bucket(self, num_tokens: int) -> int:
        return next(b for b in self.buckets if b >= num_tokens)

    def run(self, batch) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of a prepared batch (a view of a static buffer,
        valid until the next run)."""
        n = batch.input_ids.shape[0]
        t = self.bucket(n)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        if t > n:
            self.input_ids[n:t].zero_()
            self.positions[n:t].zero_()
        for i, layer in enumerate(self.layers):
            self._run_piece(i, t)
            # Straight into the buffer the next piece reads: no allocation, no copy.
            layer.self_attn.attend(
                self.q[:n], self.k[:n], self.v[:n], batch.meta, self.kv_caches[i],
                self.positions[:n], self.cos_sin, self.attn[:n],
            )  # fmt: skip
        self._run_piece(len(self.layers), t)
        return self.hidden[:n]

    def _run_piece(self, i: int, t: int) -> None:
        if self.device.type == "cuda":
            self.graphs[t, i].replay()
        else:  # the same buffers, eagerly
            self._piece(i, t)
