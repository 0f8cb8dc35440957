"""The decode step's projections at few rows (skinny GEMM) and FP8: activation
quantization, the e4m3 KV cache, the FP8 linear, the fused norm / activation quantizers."""

from __future__ import annotations

import torch

from benchmarks.kernel_bench.harness import Bench, Case, rel_error, triton_cdiv


# the decode step's projections at few rows
def bench_skinny_gemm(bench: Bench) -> None:
    """kernels/skinny_gemm.py (its default config) against F.linear (cuBLAS) at llama-3.1-8b's
    projections; rate: the weight streamed per call against the copy ceiling. One weight,
    so part of it may sit in L2 between calls: benchmarks/sweeps/skinny_gemm_sweep.py times the
    layer sequence cold, this is the quick check."""
    shapes = [("o", 4096, 4096), ("down", 4096, 14336), ("gate_up", 28672, 4096)]
    if bench.smoke:
        shapes = [("tiny", 64, 256)]
    for name, n, k in shapes:
        for m in (1, 32) if bench.smoke else (1, 16, 32, 64):
            case = Case("skinny_gemm", {"proj": name, "M": m, "N": n, "K": k})

            def body(case: Case, m=m, n=n, k=k) -> None:
                x, w = bench.randn(m, k), bench.randn(n, k) / k**0.5
                cfg = bench.skinny.default_config(m, n, k)
                out = bench.skinny.skinny_gemm(x, w, config=cfg)
                case.check = rel_error(out, bench.skinny.skinny_gemm_ref(x, w), bench.dtype)
                case.work = n * k * x.element_size()
                case.peak = bench.copy_gbps
                case.note = f"split_k={cfg.split_k} stages={cfg.num_stages}"
                case.triton_ms = bench.time_ms(
                    lambda: bench.skinny.skinny_gemm(x, w, out=out, config=cfg)
                )
                case.torch_impl = "F.linear"
                case.torch_ms = bench.time_ms(lambda: torch.nn.functional.linear(x, w))

            bench.run_case(case, body)


# FP8: activation quantization, the e4m3 KV cache, the FP8 linear
def bench_fp8(bench: Bench) -> None:
    """Per-token e4m3 quantization (every FP8 linear's input), decode attention over an e4m3
    cache (compare with the bf16 `decode` rows; stores into it are in `elementwise`), and
    the FP8 linear (quantize + torch._scaled_mm) against a bf16 matmul of the same shape."""
    from engine.models.fp8 import fp8_linear, fp8_matmul_ref, quantize_weight

    fp8 = torch.float8_e4m3fn
    if bench.smoke:
        tokens, K, N, H, Hkv, D, bs, batch, ctx = [4], 256, 128, 4, 2, 64, 16, 3, 100
    else:
        tokens, K, N, H, Hkv, D, bs, batch, ctx = (
            [64, 8192],
            8192,
            7168,
            32,
            8,
            128,
            16,
            64,
            4096,
        )
    print(f"-- fp8: activations [T, {K}], linear {K}->{N}, decode B={batch} ctx={ctx}")
    for T in tokens:
        case = Case("quantize_fp8", {"T": T, "K": K, "dtype": str(bench.dtype)})

        def body_quant(case: Case, T=T) -> None:
            x = bench.randn(T, K)
            q, scale = bench.fp8.quantize_fp8(x)
            q_ref, scale_ref = bench.fp8.quantize_fp8_ref(x)
            case.check = rel_error(q.float() * scale, q_ref.float() * scale_ref, bench.dtype)
            case.work = x.numel() * (x.element_size() * 2 + 1) + T * 4  # amax pass, quant pass
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(lambda: bench.fp8.quantize_fp8(x))
            case.torch_impl = "quantize_fp8_ref"
            case.torch_ms = bench.time_ms(lambda: bench.fp8.quantize_fp8_ref(x))

        bench.run_case(case, body_quant)

        case = Case("fp8_linear", {"T": T, "K": K, "N": N, "dtype": str(bench.dtype)})
        case.unit = "TFLOP/s"

        def body_linear(case: Case, T=T) -> None:
            x = bench.randn(T, K)
            w = bench.randn(N, K) * 0.02
            w_q, w_scale = quantize_weight(w)
            got = fp8_linear(x, w_q, w_scale)
            x_q, x_scale = bench.fp8.quantize_fp8_ref(x)
            case.check = rel_error(got, fp8_matmul_ref(x_q, x_scale, w_q, w_scale, x.dtype),
                                   bench.dtype)  # fmt: skip
            case.work = 2 * T * K * N
            case.peak = bench.matmul_tflops
            case.triton_ms = bench.time_ms(lambda: fp8_linear(x, w_q, w_scale))
            case.torch_impl = "bf16 F.linear"
            case.torch_ms = bench.time_ms(lambda: torch.nn.functional.linear(x, w))
            case.note = "triton column: quantize_fp8 + torch._scaled_mm (CUDA sm89+)"

        bench.run_case(case, body_linear)

    bench_fused_fp8_quant(bench)

    case = Case(
        "paged_decode_attention[e4m3]",
        {"shape": f"B={batch} ctx={ctx}", "H": H, "Hkv": Hkv, "D": D, "bs": bs,
         "show": ["shape"], "dtype": str(bench.dtype)},
    )  # fmt: skip

    def body_decode(case: Case) -> None:
        nb = triton_cdiv(ctx, bs)
        k_cache = bench.randn(batch * nb, bs, Hkv, D).to(fp8)
        v_cache = bench.randn(batch * nb, bs, Hkv, D).to(fp8)
        perm = torch.randperm(batch * nb, device=bench.device, generator=bench.gen)
        table = perm.view(batch, nb).to(torch.int32)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=bench.device)
        q = bench.randn(batch, H, D)
        out = torch.empty_like(q)

        def run() -> None:
            bench.dec.paged_decode_attention(
                q, k_cache, v_cache, table, seq_lens, D**-0.5, max_seq_len=ctx, out=out,
                k_scale=0.5, v_scale=2.0,
            )  # fmt: skip

        run()
        rows = min(batch, 8)
        ref = bench.dec.paged_decode_attention_ref(
            q[:rows], k_cache, v_cache, table[:rows], seq_lens[:rows], D**-0.5,
            k_scale=0.5, v_scale=2.0,
        )  # fmt: skip
        case.check = rel_error(out[:rows], ref, bench.dtype)
        case.work = batch * ctx * 2 * Hkv * D + 2 * q.numel() * q.element_size()
        case.peak = bench.copy_gbps
        case.triton_ms = bench.time_ms(run)
        case.note = "half the K/V bytes of the bf16 decode row at the same shape"

    bench.run_case(case, body_decode)


def bench_fused_fp8_quant(bench: Bench) -> None:
    """The ops that feed the decode step's FP8 linears with the per-row e4m3 quantization
    fused in (rms_norm_fp8 with the residual add, before qkv and gate_up; silu_and_mul_fp8
    before down) at llama-3.1-70b's widths, against the same op then quantize_fp8 (the
    torch column: two Triton launches, the path for more than FP8_SKINNY_MAX_ROWS rows),
    checked against that pair (the same bits: rel_l2 0; tests/kernels check the torch
    twins). Rate: the fused kernel's bytes (inputs read once, e4m3 and scales written)."""
    from kernels.skinny_gemm import FP8_SKINNY_MAX_ROWS

    if bench.smoke:
        rows, hidden, inter = [4], 256, 320
    else:
        rows, hidden, inter = [1, 16, FP8_SKINNY_MAX_ROWS], 8192, 28672
    elt = torch.empty((), dtype=bench.dtype).element_size()
    for T in rows:
        case = Case("rms_norm_fp8+residual", {"T": T, "hidden": hidden})

        def body_norm(case: Case, T=T) -> None:
            x, res = bench.randn(T, hidden), bench.randn(T, hidden)
            w = 1 + 0.1 * bench.randn(hidden)
            got = bench.rms.rms_norm_fp8(x, w, 1e-5, res)
            want = bench.fp8.quantize_fp8(bench.rms.rms_norm(x, w, 1e-5, res)[0])
            case.check = rel_error(got[0].float() * got[1], want[0].float() * want[1],
                                   bench.dtype)  # fmt: skip
            case.work = T * hidden * (3 * elt + 1) + hidden * elt + T * 4
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(lambda: bench.rms.rms_norm_fp8(x, w, 1e-5, res))
            case.torch_impl = "rms_norm + quantize_fp8 (Triton)"
            case.torch_ms = bench.time_ms(
                lambda: bench.fp8.quantize_fp8(bench.rms.rms_norm(x, w, 1e-5, res)[0])
            )

        bench.run_case(case, body_norm)

        case = Case("silu_and_mul_fp8", {"T": T, "inter": inter})

        def body_silu(case: Case, T=T) -> None:
            x = bench.randn(T, 2 * inter)
            got = bench.silu.silu_and_mul_fp8(x)
            want = bench.fp8.quantize_fp8(bench.silu.silu_and_mul(x))
            case.check = rel_error(got[0].float() * got[1], want[0].float() * want[1],
                                   bench.dtype)  # fmt: skip
            case.work = T * inter * (2 * elt + 1) + T * 4
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(lambda: bench.silu.silu_and_mul_fp8(x))
            case.torch_impl = "silu_and_mul + quantize_fp8 (Triton)"
            case.torch_ms = bench.time_ms(
                lambda: bench.fp8.quantize_fp8(bench.silu.silu_and_mul(x))
            )
            case.note = "one program per row, two passes over the row (silu_mul.py)"

        bench.run_case(case, body_silu)
