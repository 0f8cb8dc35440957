# Linear layers over one rank's shard of a weight, in the model dtype or FP8, and how they fill
# themselves from checkpoint tensors (loader.py hands each one its tensors, lazily sliced).
#   ColumnParallelLinear  output rows split over ranks (q/k/v, gate/up): no communication; a
#                         fused layer holds several checkpoint tensors ("shards") stacked.
#   RowParallelLinear     input columns split over ranks (o_proj, down_proj): partial sums,
#                         one all-reduce.
# An FP8 layer holds weight [N, K] e4m3 and weight_scale [N] float32 (fp8.py); a checkpoint
# weight in bf16/fp32 is quantized as it arrives, an e4m3 one is copied with its scales. Its input
# may arrive already quantized (Fp8Activation) when it asked for that (takes_fp8_rows).
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engine.models import ops
from engine.models.fp8 import fp8_linear, quantize_weight
from engine.models.fp8_activation import Fp8Activation, fuses_quantization
from engine.models.quant_config import Fp8Scheme
from engine.parallel.tensor_parallel import SINGLE, TensorParallel
from kernels.fp8_quant import FP8_DTYPE

# A checkpoint tensor, read lazily: read(rows, cols) → the slice on the model's device.
Reader = Callable[[slice | None, slice | None], torch.Tensor]


@dataclass(frozen=True, slots=True)
class Source:
    shape: tuple[int, ...]
    read: Reader


@dataclass(frozen=True, slots=True)
class Shard:
    """Rows [start, start + size) of a checkpoint tensor land at local rows [offset, ...)."""

    start: int
    size: int
    offset: int


class Linear(nn.Module):
    """y = x @ W^T (+ b) over this rank's rows/columns of W."""

    def __init__(
        self,
        in_features: int,  # local
        out_features: int,  # local
        *,
        bias: bool,
        dtype: torch.dtype,
        fp8: Fp8Scheme | None = None,
    ) -> None:
        super().__init__()
        self.fp8 = fp8
        wdtype = FP8_DTYPE if fp8 is not None else dtype
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=wdtype))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        self.input_scale: nn.Parameter | None = None
        if fp8 is not None:
            self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32))
            if fp8.static_input_scales:
                # The largest of the fused shards' input scales (they see the same input).
                self.input_scale = nn.Parameter(torch.empty(1, dtype=torch.float32))
        self.loaded: set[tuple[str, int]] = set()  # (attribute, shard) filled so far
        self._fp8_shards: set[int] = set()  # shards whose e4m3 weights need a weight_scale

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        """x: [..., in] in the model dtype, or (an FP8 layer) its rows already quantized by the
        op that made them, as takes_fp8_rows asked → [..., out]"""
        if self.fp8 is None:
            return ops.linear(x, self.weight, self.bias)
        return fp8_linear(x, self.weight, self.weight_scale, *self.activation_quant(), self.bias)

    def takes_fp8_rows(self, x: torch.Tensor) -> bool:
        """Whether the op that makes this layer's input x should quantize it in the same kernel
        (fp8_activation.py) and hand over an Fp8Activation: an FP8 layer, a decode step's rows."""
        return self.fp8 is not None and fuses_quantization(x)

    def activation_quant(self) -> tuple[torch.Tensor | None, float]:
        """How an FP8 layer's input is quantized: (static input scale or None, amax cap)."""
        return self.input_scale, self.fp8.activation_scale_ub

    # -- loading -------------------------------------------------------------------------

    def shards(self) -> list[Shard]:
        """Where each checkpoint shard's rows go (one shard: the whole local weight)."""
        return [Shard(0, self.weight.shape[0], 0)]

    def input_columns(self) -> slice | None:
        return None  # every input column (only row-parallel layers split them)

    def scale_rows(self, shard: Shard) -> slice:
        """Which rows of a per-channel checkpoint scale belong to this rank's rows."""
        return slice(shard.start, shard.start + shard.size)

    @torch.no_grad()
    def load(self, attr: str, shard_index: int, src: Source) -> None:
        shard = self.shards()[shard_index]
        local = slice(shard.offset, shard.offset + shard.size)
        rows = slice(shard.start, shard.start + shard.size)
        if attr == "weight":
            self._load_weight(shard_index, local, src.read(rows, self.input_columns()))
        elif attr == "bias":
            self.bias[local].copy_(src.read(rows, None))
        elif attr == "weight_scale" and self.fp8 is not None:
            scale = src.read(None, None).float().reshape(-1)
            if scale.numel() == 1:  # per-tensor: repeated over the shard's rows
                self.weight_scale[local].fill_(scale.item())
            else:
                self.weight_scale[local].copy_(scale[self.scale_rows(shard)])
        elif attr == "input_scale" and self.input_scale is not None:
            scale = src.read(None, None).float().reshape(1)
            if any(a == "input_scale" for a, _ in self.loaded):  # the shards' largest
                scale = torch.maximum(self.input_scale, scale)
            self.input_scale.copy_(scale)
        elif attr == "input_scale_ub" and self.fp8 is not None:
            pass  # the config's activation_scale_ub says the same
        else:
            raise KeyError(f"no {attr!r} in this {'FP8 ' if self.fp8 else ''}linear layer")
        self.loaded.add((attr, shard_index))

    def _load_weight(self, shard_index: int, local: slice, w: torch.Tensor) -> None:
        if w.dtype == FP8_DTYPE:
            if self.fp8 is None:
                raise ValueError("an FP8 checkpoint weight in a layer kept in the model dtype")
            self.weight[local].copy_(w)
            self._fp8_shards.add(shard_index)
        elif self.fp8 is not None:
            q, scale = quantize_weight(w)
            self.weight[local].copy_(q)
            self.weight_scale[local].copy_(scale)
            self._fp8_shards.discard(shard_index)
        else:
            self.weight[local].copy_(w)

    def missing(self) -> list[str]:
        """Checkpoint tensors this layer still lacks."""
        need = {("weight", i) for i in range(len(self.shards()))}
        if self.bias is not None:
            need |= {("bias", i) for i in range(len(self.shards()))}
        need |= {("weight_scale", i) for i in self._fp8_shards}
        if self.input_scale is not None:
            need |= {("input_scale", i) for i in self._fp8_shards}
        return sorted(f"{attr}[{i}]" for attr, i in need - self.loaded)

    def after_load(self) -> None:
        if self.input_scale is not None and not self._fp8_shards:
            self.input_scale = None  # quantized here from bf16: dynamic activations instead


class ColumnParallelLinear(Linear):
    """Checkpoint tensors (shards) of `sizes` output rows, stacked; this rank holds `ranges`
    of each ([start, length) in that tensor's rows)."""

    def __init__(
        self, in_features: int, ranges: list[tuple[int, int]], *, bias: bool,
        dtype: torch.dtype, fp8: Fp8Scheme | None = None,
    ) -> None:  # fmt: skip
        super().__init__(in_features, sum(n for _, n in ranges), bias=bias, dtype=dtype, fp8=fp8)
        offsets = [sum(n for _, n in ranges[:i]) for i in range(len(ranges))]
        self._shards = [Shard(s, n, o) for (s, n), o in zip(ranges, offsets)]

    def shards(self) -> list[Shard]:
        return self._shards


class RowParallelLinear(Linear):
    """This rank holds input columns [start, start + length) of a [out, in] weight; the
    partial products are summed over ranks."""

    def __init__(
        self, columns: tuple[int, int], out_features: int, *, dtype: torch.dtype,
        fp8: Fp8Scheme | None = None, tp: TensorParallel = SINGLE,
    ) -> None:  # fmt: skip
        super().__init__(columns[1], out_features, bias=False, dtype=dtype, fp8=fp8)
        self.columns = slice(columns[0], columns[0] + columns[1])
        self.tp = tp

    def input_columns(self) -> slice | None:
        return self.columns if self.tp.size > 1 else None

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))
