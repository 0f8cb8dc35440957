# y = x @ W^T for few rows of x: the decode step's projections, where W streams from HBM once
# and x is a sliver (M = 1 … 128 rows, against N, K in the thousands).
#   x: [M, K], w: [N, K] (nn.Linear's layout), out: [M, N]; bf16/fp16/fp32 in, fp32 accumulate.
# FP8 weights (e4m3 w with a float32 scale per output channel, w_scale: [N]) come in two forms:
#   W8A16  x in bf16/fp16: each e4m3 weight tile is widened to x's dtype in registers, so the
#          decode step streams 1 byte per weight and needs no activation quantization at all;
#   W8A8   x already e4m3 with x_scale: [M] (kernels/fp8_quant.py): an e4m3 dot, half of x's
#          bytes and twice the MMA rate, for row counts where x's re-reads start to count.
# Either way y[m, n] = (Σ_k w[n, k] · x[m, k]) · w_scale[n] (· x_scale[m]).
# cuBLAS picks tiles of 64–448 output rows × 32–64 batch rows for these shapes and reaches
# 58–88 % of the copy bandwidth on an H200 (docs/benchmarks-log.md). Here each program owns a tile
# of BLOCK_N weight rows and all the batch rows ("swap AB": the weight tile is the dot's M side,
# so a 16-row batch does not waste a 64-row MMA), and K is split over SPLIT_K programs so that
# even N = 4,096 fills the GPU. The split's partial sums meet without a second kernel: each
# program writes its float32 partial to a workspace, bumps a per-tile counter, and the program
# that arrives last adds the others' partials to its own and writes the tile (then zeroes the
# counter, so the next launch or CUDA-graph replay starts clean).
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels._launch import (
    FLOAT_DTYPES,
    capability,
    check_contiguous,
    check_last_dim_contiguous,
    check_launchable,
    check_shape,
    check_tensor,
    dot_config,
    num_sms,
    output_buffer,
)
from kernels.fp8_quant import FP8_DTYPE

MAX_SPLIT_K = 16
MAX_BLOCK_M = 256  # more rows: several row tiles (the weight is then read once per tile)
# Rows up to which the engine takes this kernel over cuBLAS. On the H200 (skinny_gemm_sweep) it
# is 2-15 % faster for every llama-3.1-8b projection up to 32 rows and for the large ones (down,
# gate/up, lm_head) up to 64; at 64 rows q/k/v ties and o_proj is 5 % slower; from 96 rows it is
# 10-50 % slower (swap-AB re-reads x once per weight tile).
SKINNY_MAX_ROWS = 64
SKINNY_SMALL_MAX_ROWS = 32  # for weights of <= SMALL_WEIGHT elements
SMALL_WEIGHT = 32 << 20
SMEM_BUDGET = 200 * 1024  # bytes of shared memory for the pipeline's stages (sm_90: 227 KB)
# e4m3 weights: rows up to which the engine takes this kernel (W8A8, x quantized per row first)
# over torch._scaled_mm. On the H200 at llama-3.1-70b's projections (benchmarks/
# skinny_gemm_sweep.py --fp8, each shape's best config): 1.3-1.75x faster at 32-64 rows (gate_up
# at 90 % of the copy rate), 1.0-1.2x at 128; but in the 70B's decode step at 128 rows the
# default config's GEMMs took 25.5 ms against 22.0 for torch._scaled_mm (64 rows: 19.1 ms, 86 %
# of the weights' copy time), so 64 is the line. W8A16 (the weight widened to bf16 in registers)
# was slower than W8A8 at every row count it was timed at; the engine does not use it.
FP8_SKINNY_MAX_ROWS = 64


def skinny_gemm_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    y = x.float() @ w.float().T
    if w_scale is not None:
        y = y * w_scale.float()[None, :]
    if x_scale is not None:
        y = y * x_scale.float().reshape(-1, 1)
    return y.to(out_dtype or x.dtype)


@dataclass(frozen=True, slots=True)
class SkinnyConfig:
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        if not 1 <= self.split_k <= MAX_SPLIT_K:
            raise ValueError(f"split_k must be in [1, {MAX_SPLIT_K}], got {self.split_k}")
        if self.num_warps not in (1, 2, 4, 8) or self.num_stages < 1:
            raise ValueError(f"bad num_warps/num_stages {self.num_warps}/{self.num_stages}")


def block_m_for(m: int) -> int:
    return min(MAX_BLOCK_M, max(16, triton.next_power_of_2(m)))


def default_config(
    m: int, n: int, k: int, num_sms: int = 132, w_bytes: int = 2, x_bytes: int = 2
) -> SkinnyConfig:
    """The H200 sweep's choice (benchmarks/sweeps/skinny_gemm_sweep.py, docs/benchmarks-log.md):
    tiles of 64 weight rows × 128 of K, 4 warps; K split in two while that keeps the programs
    within one wave (the 4,096-row o and down projections: 64 tiles → 128 programs; 6,144 rows
    already fill it); 5 stages in flight when the programs are few, 3 when there are waves of them.
    One-byte weights take K tiles twice as long, so a stage still carries 16 KB of weight."""
    block_n, block_k = 64, 128 * 2 // w_bytes
    block_m = block_m_for(m)
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 1
    while (
        split < MAX_SPLIT_K
        and tiles * split * 2 <= num_sms
        and k % (2 * split * block_k) == 0
        and k // (2 * split) >= 4 * block_k
    ):
        split *= 2
    stages = 5 if tiles < 2 * num_sms else 3
    stage_bytes = (block_n * w_bytes + block_m * x_bytes) * block_k
    stages = max(2, min(stages, SMEM_BUDGET // stage_bytes))
    return SkinnyConfig(block_n=block_n, block_k=block_k, split_k=split, num_stages=stages)


def skinny_config(x: torch.Tensor, w: torch.Tensor) -> SkinnyConfig | None:
    """The config skinny_gemm runs x @ w^T with where it beats cuBLAS (or torch._scaled_mm), else
    None: a Hopper GPU, both operands 16-bit or both e4m3 (W8A8), contiguous in K, at most
    SKINNY_MAX_ROWS rows (SKINNY_SMALL_MAX_ROWS for a small 16-bit weight, FP8_SKINNY_MAX_ROWS
    for e4m3), K a whole number of the config's splits. Host metadata only (safe under
    CUDA-graph capture)."""
    if not x.is_cuda or x.dim() != 2 or w.dim() != 2:
        return None
    fp8 = x.dtype == FP8_DTYPE and w.dtype == FP8_DTYPE
    if x.dtype not in (torch.bfloat16, torch.float16) and not fp8:
        return None
    m, k = x.shape
    max_rows = FP8_SKINNY_MAX_ROWS if fp8 else SKINNY_MAX_ROWS
    if not 0 < m <= max_rows or w.dtype != x.dtype or w.shape[1] != k:
        return None
    if not fp8 and m > SKINNY_SMALL_MAX_ROWS and w.numel() <= SMALL_WEIGHT:
        return None
    if x.stride(1) != 1 or w.stride(1) != 1 or capability(x.device)[0] != 9:
        return None
    size = x.element_size()
    config = default_config(m, w.shape[0], k, num_sms(x.device), size, size)
    return config if k % (config.split_k * config.block_k) == 0 else None


# ---------------------------------------------------------------------------------------------
# Triton kernel. Program (n tile, k split, m tile) computes acc[BLOCK_N, BLOCK_M] = W[n tile,
# k range] @ x[m tile, k range]^T, the transpose of the output tile. K ranges are whole
# BLOCK_K tiles (the launcher checks K % (SPLIT_K * BLOCK_K) == 0), so only N and M are masked.
# ---------------------------------------------------------------------------------------------
# M (the batch rows) only masks: not specialised on, so each row count of a CUDA-graph ladder
# does not compile its own variant, and it stays a tensor (int64 arithmetic below).
@triton.jit(do_not_specialize=["M"])
def _skinny_gemm_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    out_ptr,  # [M, N]
    w_scale_ptr,  # [N] float32 (read only when W_SCALED)
    x_scale_ptr,  # [M] float32 (read only when X_SCALED)
    partial_ptr,  # [SPLIT_K, M, N] float32 (unused when SPLIT_K == 1)
    counter_ptr,  # [num n tiles * num m tiles] int32, zero between launches
    M,
    N,
    k_per_split,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    W_SCALED: tl.constexpr,  # e4m3 weights with per-channel scales
    X_SCALED: tl.constexpr,  # e4m3 activations with per-row scales (implies W_SCALED)
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output columns
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] batch rows
    offs_k = tl.arange(0, BLOCK_K)
    k_start = pid_k * k_per_split
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + (k_start + offs_k)[None, :]
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + (k_start + offs_k)[None, :]
    m_mask = offs_m[:, None] < M
    n_mask = offs_n[:, None] < N

    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for _ in range(0, k_per_split, BLOCK_K):
        if EVEN_N:
            w = tl.load(w_ptrs)  # [BLOCK_N, BLOCK_K]
        else:
            w = tl.load(w_ptrs, mask=n_mask, other=0.0)
        x = tl.load(x_ptrs, mask=m_mask, other=0.0)  # [BLOCK_M, BLOCK_K]
        if W_SCALED and not X_SCALED and not UPCAST:
            w = w.to(x.dtype)  # W8A16: widen the e4m3 tile in registers
        if UPCAST:
            w = w.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K

    # The scales are per output row n and per batch row m, so they commute with the K sum and
    # each split's partial can carry them.
    if W_SCALED:
        w_scale = tl.load(w_scale_ptr + offs_n, mask=offs_n < N, other=0.0)  # [BLOCK_N]
        acc = acc * w_scale[:, None]
    if X_SCALED:
        x_scale = tl.load(x_scale_ptr + offs_m, mask=offs_m < M, other=0.0)  # [BLOCK_M]
        acc = acc * x_scale[None, :]
    # out[m, n] for the tile, addressed as [BLOCK_N, BLOCK_M] like acc
    tile_mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    out_ptrs = out_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tile_mask)
    else:
        # partial[s, m, n], contiguous
        plane = M.to(tl.int64) * N  # int64: SPLIT_K * M * N may pass 2**31
        tile_offs = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.store(partial_ptr + pid_k * plane + tile_offs, acc, mask=tile_mask)
        # every thread's partial is written before one thread publishes the arrival (release);
        # the acquire on the count orders the last arriver's reads after the others' writes
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            for s in tl.static_range(SPLIT_K):
                if s != pid_k:
                    # .cg: from L2, where the other programs' writes landed (not a stale L1 line)
                    acc += tl.load(
                        partial_ptr + s * plane + tile_offs, mask=tile_mask, other=0.0,
                        cache_modifier=".cg",
                    )  # fmt: skip
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=tile_mask)
            tl.store(counter_ptr + tile, 0)


class _Workspace:
    """Per device: the split-K partials buffer and the arrival counters. Buffers only grow, and
    an outgrown one is kept alive: CUDA graphs captured earlier hold its address. Launches on
    one stream share them (each launch finishes with its counters back at zero)."""

    def __init__(self) -> None:
        self.partials: dict[torch.device, torch.Tensor] = {}
        self.counters: dict[torch.device, torch.Tensor] = {}
        self.retired: list[torch.Tensor] = []

    def get(self, device: torch.device, partial_numel: int, num_tiles: int):
        p, c = self.partials.get(device), self.counters.get(device)
        grow = p is None or p.numel() < partial_numel or c is None or c.numel() < num_tiles
        if grow and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # the counters' zero fill would only happen when the graph replays: the first launch
            # of the shape must come before the capture (capture_graph warms up eagerly)
            raise RuntimeError(
                "skinny_gemm needs a larger workspace inside a CUDA-graph capture; call it once "
                "with this shape before capturing"
            )
        if p is None or p.numel() < partial_numel:
            if p is not None:
                self.retired.append(p)
            p = torch.empty(max(partial_numel, 1 << 20), dtype=torch.float32, device=device)
            self.partials[device] = p
        if c is None or c.numel() < num_tiles:
            if c is not None:
                self.retired.append(c)
            c = torch.zeros(max(num_tiles, 4096), dtype=torch.int32, device=device)
            self.counters[device] = c
        return p, c


WORKSPACE = _Workspace()


def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    w_scale: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    config: SkinnyConfig | None = None,
) -> torch.Tensor:
    """Triton twin of `skinny_gemm_ref`: x [M, K] @ w[N, K]^T → [M, N] in x's dtype, or in
    out_dtype for e4m3 x. e4m3 w needs w_scale [N]; e4m3 x needs x_scale [M] (or [M, 1])."""
    fp8_w = w.dtype == FP8_DTYPE
    fp8_x = x.dtype == FP8_DTYPE
    check_tensor("x", x, ndim=2, dtypes=(*FLOAT_DTYPES, FP8_DTYPE))
    check_tensor("w", w, ndim=2, dtypes=(x.dtype, FP8_DTYPE), device=x.device)
    check_last_dim_contiguous("x", x)
    check_last_dim_contiguous("w", w)
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"w has {w.shape[1]} columns, x has {k}")
    if fp8_x and not fp8_w:
        raise ValueError("e4m3 activations need e4m3 weights")
    if fp8_w != (w_scale is not None) or fp8_x != (x_scale is not None):
        raise ValueError("w_scale (x_scale) goes with e4m3 w (x), and only with them")
    if fp8_w:
        check_tensor("w_scale", w_scale, ndim=1, dtypes=(torch.float32,), device=x.device)
        check_shape("w_scale", w_scale, (n,))
        check_contiguous("w_scale", w_scale)
    if fp8_x:
        x_scale = x_scale.reshape(-1)
        check_tensor("x_scale", x_scale, ndim=1, dtypes=(torch.float32,), device=x.device)
        check_shape("x_scale", x_scale, (m,))
        check_contiguous("x_scale", x_scale)
        if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"e4m3 x needs a 16- or 32-bit out_dtype, got {out_dtype}")
    like = x if not fp8_x else torch.empty(0, dtype=out_dtype, device=x.device)
    out = output_buffer("out", out, (m, n), like)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    config = config or default_config(
        m, n, k, num_sms(x.device), w.element_size(), x.element_size()
    )
    if k % (config.split_k * config.block_k):
        raise ValueError(
            f"K ({k}) must be a multiple of split_k * block_k ({config.split_k} * {config.block_k})"
        )
    check_launchable(x)
    block_m = block_m_for(m)
    grid = (triton.cdiv(n, config.block_n), config.split_k, triton.cdiv(m, block_m))
    num_tiles = grid[0] * grid[2]
    partial_numel = config.split_k * m * n if config.split_k > 1 else 0
    partials, counters = WORKSPACE.get(x.device, partial_numel, num_tiles)
    upcast, precision = dot_config(x.dtype)
    _skinny_gemm_kernel[grid](
        x, w, out,
        w_scale if fp8_w else partials, x_scale if fp8_x else partials,
        partials, counters,
        m, n, k // config.split_k,
        x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=config.split_k, EVEN_N=n % config.block_n == 0,
        W_SCALED=fp8_w, X_SCALED=fp8_x,
        UPCAST=upcast, PRECISION=precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out
