"""The kernel bench's harness: a case and its report row, the check against a torch
reference, the timer, the measured device peaks and the shared FLOP count."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

# relative L2 error above which a check fails (bf16 outputs are ~3e-3 off the fp32-math refs)
REL_L2_LIMIT = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@dataclass
class Case:
    kernel: str
    config: dict[str, Any]
    check: dict[str, Any] = field(default_factory=dict)
    triton_ms: float | None = None
    torch_ms: float | None = None
    torch_impl: str | None = None
    unit: str = "GB/s"  # or TFLOP/s
    work: float = 0.0  # bytes or FLOPs per call
    peak: float | None = None  # measured copy GB/s or matmul TFLOP/s
    note: str = ""
    error: str | None = None

    def rate(self, ms: float | None) -> float | None:
        if not ms:
            return None
        scale = 1e9 if self.unit == "GB/s" else 1e12
        return self.work / (ms * 1e-3) / scale

    def as_dict(self) -> dict[str, Any]:
        t_rate, r_rate = self.rate(self.triton_ms), self.rate(self.torch_ms)
        return {
            "kernel": self.kernel,
            "config": {k: v for k, v in self.config.items() if k != "show"},
            "check": self.check,
            "triton_ms": self.triton_ms,
            "torch_ms": self.torch_ms,
            "torch_impl": self.torch_impl,
            "unit": self.unit,
            "work": self.work,
            "triton_rate": t_rate,
            "torch_rate": r_rate,
            "triton_pct_of_peak": 100 * t_rate / self.peak if t_rate and self.peak else None,
            "speedup": self.torch_ms / self.triton_ms if self.torch_ms and self.triton_ms else None,
            "note": self.note,
            "error": self.error,
        }


def rel_error(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> dict[str, Any]:
    a, b = actual.float(), expected.float()
    diff = a - b
    rel = (diff.norm() / b.norm().clamp_min(1e-30)).item()
    finite = bool(torch.isfinite(a).all().item())
    return {
        "max_abs": diff.abs().max().item() if diff.numel() else 0.0,
        "rel_l2": rel,
        "ok": finite and rel <= REL_L2_LIMIT[dtype],
    }


class Bench:
    def __init__(self, smoke: bool, warmup_ms: int, rep_ms: int) -> None:
        import triton
        import triton.testing

        from kernels import (
            dense_prefill_attention,
            fp8_quant,
            paged_decode_attention,
            paged_prefill_attention,
            rms_norm,
            rotary,
            rotary_store_kv,
            silu_mul,
            skinny_gemm,
            store_kv,
            token_bitmask,
        )

        self.triton = triton
        self.dec, self.pre = paged_decode_attention, paged_prefill_attention
        self.dense = dense_prefill_attention
        self.kv, self.rms, self.rot, self.silu = store_kv, rms_norm, rotary, silu_mul
        self.rkv = rotary_store_kv
        self.fp8 = fp8_quant
        self.skinny = skinny_gemm
        self.bitmask = token_bitmask
        self.smoke = smoke
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.dtype = torch.bfloat16
        self.cases: list[Case] = []
        self.copy_gbps: float | None = None
        self.matmul_tflops: float | None = None
        self.prefill_8k: dict[str, Any] | None = None
        self.prefill_sweep: dict[str, Any] | None = None
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(0)

    # -- helpers ------------------------------------------------------------------------------
    def cos_sin(self, max_pos: int, head_dim: int) -> torch.Tensor:
        """The rotary table [max_pos, head_dim] float32: cos in the first half, sin after."""
        inv = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, device=self.device).float() / head_dim)
        f = torch.arange(max_pos, device=self.device).float()[:, None] * inv[None, :]
        return torch.cat((f.cos(), f.sin()), dim=-1).contiguous()

    def time_ms(self, fn) -> float:
        if self.cuda:
            return float(
                self.triton.testing.do_bench(
                    fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"
                )
            )
        t0 = time.perf_counter()  # interpreter smoke run: one call, wall clock
        fn()
        return (time.perf_counter() - t0) * 1e3

    def randn(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype or self.dtype, device=self.device)
        return t.normal_(generator=self.gen)

    def run_case(self, case: Case, body) -> None:
        """Run one case; an exception is recorded (and printed) instead of aborting the run."""
        try:
            body(case)
        except Exception as e:  # keep benchmarking the other kernels
            case.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        self.cases.append(case)
        self.print_row(case)
        if self.cuda:
            torch.cuda.empty_cache()

    def print_header(self) -> None:
        print(
            f"{'kernel':<24} {'config':<40} {'triton ms':>10} {'rate':>14} {'%peak':>6} "
            f"{'torch ms':>10} {'speedup':>8}  check"
        )

    def print_row(self, c: Case) -> None:
        d = c.as_dict()
        shown = c.config.get("show", [k for k in c.config if k != "dtype"])
        cfg = " ".join(
            str(c.config[k]) if k == "shape" else f"{k}={c.config[k]}"
            for k in shown
            if k in c.config
        )
        rate = f"{d['triton_rate']:.1f} {c.unit}" if d["triton_rate"] else "-"
        pct = f"{d['triton_pct_of_peak']:.0f}%" if d["triton_pct_of_peak"] else "-"
        tms = f"{c.triton_ms:.4f}" if c.triton_ms else "-"
        rms = f"{c.torch_ms:.4f}" if c.torch_ms else "-"
        sp = f"{d['speedup']:.1f}x" if d["speedup"] else "-"
        if c.error:
            chk = f"ERROR {c.error[:60]}"
        elif c.check:
            ok = "ok" if c.check["ok"] else "FAIL"
            chk = f"{ok} rel_l2={c.check['rel_l2']:.1e} max_abs={c.check['max_abs']:.1e}"
        else:
            chk = "-"
        print(
            f"{c.kernel:<24} {cfg[:40]:<40} {tms:>10} {rate:>14} {pct:>6} {rms:>10} {sp:>8}  {chk}"
        )

    # -- device peaks -------------------------------------------------------------------------
    def measure_peaks(self) -> None:
        self.copy_gbps = self._copy_gbps()
        m = 8192 if not self.smoke else 128
        self.matmul_tflops = self._matmul_tflops(m)
        print(
            f"measured peaks: copy {self.copy_gbps:.0f} GB/s (read+write), "
            f"bf16 matmul {m}^3 {self.matmul_tflops:.1f} TFLOP/s"
        )

    def _copy_gbps(self) -> float:
        n = (1 << 28) if not self.smoke else (1 << 16)  # 1 GiB of float32 (256 KiB when smoke)
        src = torch.empty(n, dtype=torch.float32, device=self.device).fill_(1.0)
        dst = torch.empty_like(src)
        ms = self.time_ms(lambda: dst.copy_(src))
        return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9

    def _matmul_tflops(self, m: int) -> float:
        a = self.randn(m, m)
        b = self.randn(m, m)
        ms = self.time_ms(lambda: torch.matmul(a, b))
        return 2 * m**3 / (ms * 1e-3) / 1e12


def causal_prefill_flops(n: int, prefix: int, q_len: int, heads: int, head_dim: int) -> float:
    """QK^T and PV (2 FLOPs per MAC each) of n chunks of q_len queries after `prefix` cached
    keys: the query at chunk position j sees prefix + j + 1 keys."""
    keys_seen = q_len * (prefix + 1) + q_len * (q_len - 1) // 2
    return 4.0 * n * keys_seen * heads * head_dim


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
