"""Prefill attention backends on one GPU, side by side: our Triton dense kernel against torch's
own fused attention (SDPA per sequence with each of its backends, and the varlen flash op over a
packed batch, with any cached prefix gathered out of the paged cache first, or read in place
through a block table where the installed torch supports it). Every variant is checked against
the Triton kernel's output (itself checked against the fp32 reference in tests) and timed with
CUDA events after an L2 flush (prefill_cases.time_ms); TFLOP/s count the causal half (QK^T
and PV), as benchmarks/kernel_bench.

    python -m benchmarks.sweeps.prefill_backends --json OUT.json   # CUDA only
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.sweeps.prefill_cases import flops as causal_flops  # noqa: E402
from benchmarks.sweeps.prefill_cases import time_ms  # noqa: E402
from kernels.dense_prefill_attention import dense_prefill_attention  # noqa: E402

H, HKV, D, BS = 32, 8, 128, 16
DIMS = (H, HKV, D, BS)  # as benchmarks/sweeps/prefill_cases.py
SHAPES = [(1, 0, 8192), (1, 0, 4096), (4, 0, 2048), (16, 0, 512), (4, 1200, 800),
          (4, 3584, 512), (16, 1024, 128), (1, 16384, 8192)]  # fmt: skip


def make_inputs(n: int, prefix: int, q_len: int, seed: int = 0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.empty(n * q_len, H + 2 * HKV, D, dtype=torch.bfloat16, device="cuda")
    qkv.normal_(generator=g)
    q, k, v = qkv.split([H, HKV, HKV], dim=1)
    seq_len, per_seq = prefix + q_len, -(-(prefix + q_len) // BS)
    k_cache = torch.empty(n * per_seq, BS, HKV, D, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.empty_like(k_cache)
    k_cache.normal_(generator=g)
    v_cache.normal_(generator=g)
    table = torch.randperm(n * per_seq, device="cuda", generator=g).view(n, per_seq).int()
    slots = (table.long()[:, :, None] * BS + torch.arange(BS, device="cuda")).flatten(1)
    k_cache.view(-1, HKV, D)[slots[:, prefix:seq_len].flatten()] = k
    v_cache.view(-1, HKV, D)[slots[:, prefix:seq_len].flatten()] = v
    seq_lens = torch.full((n,), seq_len, dtype=torch.int32, device="cuda")
    cu_q = torch.arange(n + 1, dtype=torch.int32, device="cuda") * q_len
    cu_k = torch.arange(n + 1, dtype=torch.int32, device="cuda") * seq_len
    return dict(n=n, prefix=prefix, q_len=q_len, q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache,
                table=table, seq_lens=seq_lens, cu_q=cu_q, cu_k=cu_k,
                key_slots=slots[:, :seq_len].flatten(), out=torch.empty_like(q))  # fmt: skip


def matmul_tflops() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    return 2 * 8192**3 / (time_ms(lambda: torch.matmul(a, b)) * 1e-3) / 1e12


def variants(inp: dict) -> dict:
    q, k, v, out, scale = inp["q"], inp["k"], inp["v"], inp["out"], D**-0.5
    n, prefix, q_len = inp["n"], inp["prefix"], inp["q_len"]
    found = {}

    def triton():
        cache = (inp["k_cache"], inp["v_cache"], inp["table"], inp["seq_lens"], inp["cu_q"])
        return dense_prefill_attention(q, k, v, *cache, q_len, scale, out=out)

    found["triton"] = triton
    if prefix == 0:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):  # fmt: skip

            def sdpa(backend=backend):
                res = torch.empty_like(q)
                with sdpa_kernel([backend]):
                    for i in range(n):
                        rows = slice(i * q_len, (i + 1) * q_len)
                        qd, kd, vd = (t[rows].unsqueeze(0).transpose(1, 2) for t in (q, k, v))
                        o = F.scaled_dot_product_attention(
                            qd, kd, vd, is_causal=True, scale=scale, enable_gqa=True
                        )
                        res[rows] = o.transpose(1, 2)[0]
                return res

            found[name] = sdpa

    def gathered():
        # every sequence's keys back to back: cached prefix out of the pool, then the chunk's own
        if prefix == 0:
            return k, v
        kf = inp["k_cache"].view(-1, HKV, D)[inp["key_slots"]]
        vf = inp["v_cache"].view(-1, HKV, D)[inp["key_slots"]]
        return kf, vf

    def flash_varlen():
        kf, vf = gathered()
        return torch.ops.aten._flash_attention_forward(
            q, kf, vf, inp["cu_q"], inp["cu_k"], q_len, prefix + q_len, 0.0, True, False,
            scale=scale,
        )[0]  # fmt: skip

    found["flash_varlen"] = flash_varlen
    try:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        found["varlen_attn"] = lambda: varlen_attn(
            q, *gathered(), inp["cu_q"], inp["cu_k"], q_len, prefix + q_len, is_causal=True,
            **({"scale": scale} if "scale" in params else {}),
        )  # fmt: skip
        if "block_table" in params:
            found["varlen_attn_paged"] = lambda: varlen_attn(
                q, inp["k_cache"], inp["v_cache"], inp["cu_q"], inp["cu_k"], q_len,
                prefix + q_len, is_causal=True, block_table=inp["table"],
                **({"scale": scale} if "scale" in params else {}),
            )  # fmt: skip
    except ImportError as exc:
        print(f"no torch.nn.attention.varlen: {exc}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    peak = matmul_tflops()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; matmul {peak:.1f} TFLOP/s")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "matmul_bf16_TFLOPs": peak, "rows": []}  # fmt: skip
    for n, prefix, q_len in SHAPES:
        inp = make_inputs(n, prefix, q_len)
        label = f"{n}x{q_len}" + (f" +prefix {prefix}" if prefix else "")
        want = None
        for name, fn in variants(inp).items():
            row = {"shape": label, "variant": name}
            try:
                got = fn()
                torch.cuda.synchronize()
                if name == "triton":
                    want = got.float().clone()
                else:
                    diff = (got.float() - want).abs()
                    row["max_abs"] = diff.max().item()
                    row["rel_l2"] = (diff.norm() / want.norm()).item()
                    row["ok"] = row["max_abs"] < 0.0625 and row["rel_l2"] < 2e-2
                ms = time_ms(fn)
                work = causal_flops((n, prefix, q_len), DIMS)
                row.update(ms=ms, tflops=work / (ms * 1e-3) / 1e12)
                row["pct_of_matmul"] = 100 * row["tflops"] / peak
                print(f"  {label:22s} {name:18s} {ms:8.4f} ms {row['tflops']:6.1f} TFLOP/s "
                      f"{row['pct_of_matmul']:5.1f} %  {row.get('rel_l2', 0):.1e}")  # fmt: skip
            except Exception as exc:  # a backend this torch or GPU lacks: recorded, not fatal
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(f"  {label:22s} {name:18s} ERROR {row['error'][:160]}")
                if "--trace" in sys.argv:
                    traceback.print_exc()
            report["rows"].append(row)
        del inp
        torch.cuda.empty_cache()
    report["elapsed_s"] = time.perf_counter() - t0
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"done in {report['elapsed_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
