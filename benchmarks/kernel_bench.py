"""Micro-benchmarks of the Triton kernels in kernels/ against their torch twins.

    python -m benchmarks.kernel_bench --json OUT.json   # on a CUDA GPU (sized for an H200)
    python -m benchmarks.kernel_bench --smoke           # tiny shapes; CPU: TRITON_INTERPRET=1
    python -m benchmarks.kernel_bench --only prefill_sweep --json OUT.json  # opt-in section

The prefill_sweep section (benchmarks/sweeps/prefill_sweep.py; not in the default run) probes every
dense prefill attention variant in a child process, then checks and times the survivors on
1 x 8192 causal and the best ones on the other prefill shapes.

For every case the script first CHECKS the Triton launcher against its torch reference at that
size (max abs error and relative L2 error are printed; a failing check is reported and makes the
exit status 1), then times both with triton.testing.do_bench (median, with warmup and an L2
flush between runs). Memory-bound kernels report achieved GB/s against a measured
device-to-device copy bandwidth (a large Tensor.copy_, read + write bytes); prefill attention
reports TFLOP/s against a measured bf16 8192^3 torch.matmul rate. The torch side is the
reference twin, or F.scaled_dot_product_attention (flash, dense K/V) for full prefills.

Imports only torch, triton and kernels.*; importable (see `main`). Tested under the interpreter
only: the GPU numbers come from whoever runs it on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

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
        )

        self.triton = triton
        self.dec, self.pre = paged_decode_attention, paged_prefill_attention
        self.dense = dense_prefill_attention
        self.kv, self.rms, self.rot, self.silu = store_kv, rms_norm, rotary, silu_mul
        self.rkv = rotary_store_kv
        self.fp8 = fp8_quant
        self.skinny = skinny_gemm
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

    # -- paged decode attention ---------------------------------------------------------------
    def bench_decode(self) -> None:
        if self.smoke:
            H, Hkv, D, bs = 4, 2, 64, 16
            grid = [(1, 40), (3, 100)]
            mixed = (3, 100)
        else:
            H, Hkv, D, bs = 32, 8, 128, 16
            grid = [(b, c) for b in (1, 16, 64, 256) for c in (512, 1024, 4096, 16384)]
            grid.remove((64, 4096))
            grid.insert(0, (64, 4096))  # the headline case first
            mixed = (64, 8192)
        print(f"-- decode: q heads {H}, kv heads {Hkv}, head_dim {D}, block {bs}, {self.dtype}")
        scale = D**-0.5
        elt = torch.empty((), dtype=self.dtype).element_size()
        bytes_per_token = 2 * Hkv * D * elt  # K + V
        cases = [(b, [c] * b, f"B={b} ctx={c}") for b, c in grid]
        g = torch.Generator().manual_seed(1)
        mixed_lens = torch.randint(1, mixed[1] + 1, (mixed[0],), generator=g).tolist()
        cases.append((mixed[0], mixed_lens, f"B={mixed[0]} ctx=U[1,{mixed[1]}]"))

        def blocks_for(lens: list[int]) -> int:
            return sum(triton_cdiv(n, bs) for n in lens)

        if self.cuda:  # drop cases whose K/V would not fit (leaving room for the references)
            budget_blocks = int(0.6 * torch.cuda.mem_get_info()[0]) // (bs * bytes_per_token)
            for _, _lens, label in [c for c in cases if blocks_for(c[1]) > budget_blocks]:
                print(f"paged_decode_attention   {label}: skipped, K/V would not fit in memory")
            cases = [c for c in cases if blocks_for(c[1]) <= budget_blocks]
        num_blocks = max(blocks_for(lens) for _, lens, _ in cases)
        k_cache = self.randn(num_blocks, bs, Hkv, D)
        v_cache = self.randn(num_blocks, bs, Hkv, D)
        ref_token_limit = 64 * 4096 if not self.smoke else 1 << 30  # torch ref timing budget
        check_rows = 8

        def make(batch: int, lens: list[int]):
            nb = [triton_cdiv(n, bs) for n in lens]
            width = max(nb)
            perm = torch.randperm(num_blocks, device=self.device, generator=self.gen)
            table = torch.zeros(batch, width, dtype=torch.int32, device=self.device)
            used = 0
            for i, n in enumerate(nb):  # shuffled pages, like a long-running cache
                table[i, :n] = perm[used : used + n]
                used += n
            seq_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)
            return table, seq_lens

        for batch, lens, label in cases:
            max_len = max(lens)
            splits = self.dec.choose_num_splits(batch, Hkv, max_len, self.dec.num_sms(self.device))
            case = Case(
                "paged_decode_attention",
                {"shape": label, "splits": splits, "H": H, "Hkv": Hkv, "D": D, "bs": bs,
                 "show": ["shape", "splits"],
                 "dtype": str(self.dtype)},
            )  # fmt: skip

            def body(case: Case, batch=batch, lens=lens, max_len=max_len) -> None:
                table, seq_lens = make(batch, lens)
                q = self.randn(batch, H, D)
                out = torch.empty_like(q)
                kw = {"max_seq_len": max_len, "out": out}

                def run() -> None:
                    self.dec.paged_decode_attention(
                        q, k_cache, v_cache, table, seq_lens, scale, **kw
                    )

                run()
                rows = min(batch, check_rows)
                ref = self.dec.paged_decode_attention_ref(
                    q[:rows], k_cache, v_cache, table[:rows], seq_lens[:rows], scale
                )
                case.check = rel_error(out[:rows], ref, self.dtype)
                case.work = sum(lens) * bytes_per_token + 2 * q.numel() * elt + table.numel() * 4
                case.peak = self.copy_gbps
                case.triton_ms = self.time_ms(run)
                if sum(lens) <= ref_token_limit:
                    ref_out = torch.empty_like(q)
                    case.torch_impl = "paged_decode_attention_ref"
                    case.torch_ms = self.time_ms(
                        lambda: self.dec.paged_decode_attention_ref(
                            q, k_cache, v_cache, table, seq_lens, scale, out=ref_out
                        )
                    )
                else:
                    case.note = "torch ref not timed (gathers the whole context in fp32)"

            self.run_case(case, body)

    # -- decode split counts with a straggler ---------------------------------------------------
    def bench_decode_splits(self) -> None:
        """One long row among short ones: every row is cut into the same number of splits, so
        the long row's ranges set the step unless the count is high enough (the choice of
        balanced_num_splits, marked `balanced`, against fixed counts)."""
        if self.smoke:
            H, Hkv, D, bs, batch, short, long = 4, 2, 64, 16, 6, 40, 300
        else:
            H, Hkv, D, bs, batch, short, long = 32, 8, 128, 16, 96, 2400, 30000
        print(f"-- decode splits: B={batch}, rows of {short} keys with and without one of {long}")
        scale = D**-0.5
        elt = torch.empty((), dtype=self.dtype).element_size()
        for lens, label in (([short] * batch, "even"), ([short] * (batch - 1) + [long], "long")):
            nb = [triton_cdiv(n, bs) for n in lens]
            num_blocks = sum(nb)
            k_cache = self.randn(num_blocks, bs, Hkv, D)
            v_cache = self.randn(num_blocks, bs, Hkv, D)
            table = torch.zeros(batch, max(nb), dtype=torch.int32, device=self.device)
            perm = torch.randperm(num_blocks, device=self.device, generator=self.gen)
            used = 0
            for i, n in enumerate(nb):
                table[i, :n] = perm[used : used + n].to(torch.int32)
                used += n
            seq_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)
            balanced = self.dec.balanced_num_splits(lens, Hkv, self.dec.num_sms(self.device))
            for splits in sorted({1, 2, 4, 8, 16, 32, balanced}):
                case = Case(
                    "paged_decode_attention",
                    {"shape": f"B={batch} {label}", "splits": splits,
                     "balanced": splits == balanced, "H": H, "Hkv": Hkv, "D": D, "bs": bs,
                     "show": ["shape", "splits", "balanced"], "dtype": str(self.dtype)},
                )  # fmt: skip

                def body(
                    case: Case, splits=splits, lens=lens, kv=(k_cache, v_cache, table, seq_lens)
                ) -> None:
                    k_cache, v_cache, table, seq_lens = kv
                    q = self.randn(batch, H, D)
                    out = torch.empty_like(q)

                    def run() -> None:
                        self.dec.paged_decode_attention(
                            q, k_cache, v_cache, table, seq_lens, scale,
                            max_seq_len=max(lens), num_splits=splits, out=out,
                        )  # fmt: skip

                    run()
                    rows = min(batch, 4)
                    ref = self.dec.paged_decode_attention_ref(
                        q[-rows:], k_cache, v_cache, table[-rows:], seq_lens[-rows:], scale
                    )
                    case.check = rel_error(out[-rows:], ref, self.dtype)
                    case.work = sum(lens) * 2 * Hkv * D * elt
                    case.peak = self.copy_gbps
                    case.triton_ms = self.time_ms(run)

                self.run_case(case, body)

    # -- paged prefill attention --------------------------------------------------------------
    def _check_and_time_prefill(self, case: Case, run, out, ref_args: tuple, work: float) -> None:
        """Run once, check `out` against the paged torch reference, then time `run`."""
        run()
        ref = self.pre.paged_prefill_attention_ref(*ref_args)
        case.check = rel_error(out, ref, self.dtype)
        del ref
        case.work, case.peak = work, self.matmul_tflops
        case.triton_ms = self.time_ms(run)

    def _prefill_inputs(self, n: int, q_len: int, seq_len: int, H: int, Hkv: int, D: int, bs: int):
        """n sequences of seq_len keys in a shuffled paged cache, each with a q_len-token chunk:
        q [n * q_len, H, D], k_cache / v_cache, block table, seq_lens, query_start_loc."""
        blocks_per_seq = triton_cdiv(seq_len, bs)
        num_blocks = n * blocks_per_seq
        k_cache = self.randn(num_blocks, bs, Hkv, D)
        v_cache = self.randn(num_blocks, bs, Hkv, D)
        perm = torch.randperm(num_blocks, device=self.device, generator=self.gen)
        table = perm.view(n, blocks_per_seq).to(torch.int32)
        seq_lens = torch.full((n,), seq_len, dtype=torch.int32, device=self.device)
        qsl = torch.arange(n + 1, dtype=torch.int32, device=self.device) * q_len
        return self.randn(n * q_len, H, D), k_cache, v_cache, table, seq_lens, qsl

    def bench_prefill(self) -> None:
        import torch.nn.functional as F

        if self.smoke:
            H, Hkv, D, bs = 4, 2, 64, 16
            full = [(1, 48), (2, 30)]
            chunked = [(2, 40, 8)]
        else:
            H, Hkv, D, bs = 32, 8, 128, 16
            full = [(1, 4096), (4, 2048), (16, 512), (1, 8192)]
            # (seqs, cached prefix, chunk); the last: a long document's third 8k chunk
            chunked = [(4, 3584, 512), (16, 1024, 128), (1, 16384, 8192)]
        print(f"-- prefill: q heads {H}, kv heads {Hkv}, head_dim {D}, block {bs}, {self.dtype}")
        group = H // Hkv
        scale = D**-0.5
        specs = [(n, 0, L) for n, L in full] + list(chunked)
        for n, prefix, q_len in specs:
            seq_len = prefix + q_len
            label = f"{n}x{q_len}" + (f" +prefix {prefix}" if prefix else "")
            case = Case(
                "paged_prefill_attention",
                {
                    "shape": label,
                    "H": H,
                    "Hkv": Hkv,
                    "D": D,
                    "bs": bs,
                    "dtype": str(self.dtype),
                    "show": ["shape"],
                },
                unit="TFLOP/s",
            )

            def body(case: Case, n=n, prefix=prefix, q_len=q_len, seq_len=seq_len) -> None:
                q, k_cache, v_cache, table, seq_lens, qsl = self._prefill_inputs(
                    n, q_len, seq_len, H, Hkv, D, bs
                )
                out = torch.empty_like(q)

                def run() -> None:
                    self.pre.paged_prefill_attention(
                        q, k_cache, v_cache, table, seq_lens, qsl, q_len, scale, out=out
                    )

                ref_args = (q, k_cache, v_cache, table, seq_lens, qsl, q_len, scale)
                work = causal_prefill_flops(n, prefix, q_len, H, D)
                self._check_and_time_prefill(case, run, out, ref_args, work)
                if prefix == 0:
                    # dense flash baseline: K/V already gathered and expanded to all heads
                    k = k_cache[table.long()].flatten(1, 2)[:, :seq_len]  # [n, L, Hkv, D]
                    v = v_cache[table.long()].flatten(1, 2)[:, :seq_len]
                    k = k.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
                    v = v.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
                    qd = q.view(n, q_len, H, D).transpose(1, 2).contiguous()
                    case.torch_impl = "F.scaled_dot_product_attention(is_causal)"
                    case.torch_ms = self.time_ms(
                        lambda: F.scaled_dot_product_attention(qd, k, v, is_causal=True)
                    )
                else:
                    ref_out = torch.empty_like(q)
                    case.torch_impl = "paged_prefill_attention_ref"
                    case.torch_ms = self.time_ms(
                        lambda: self.pre.paged_prefill_attention_ref(
                            q, k_cache, v_cache, table, seq_lens, qsl, q_len, scale, out=ref_out
                        )
                    )

            self.run_case(case, body)

            # the dense path on the same shape (the engine's choice for a float cache): the
            # chunk's k/v rows as this step's new tokens, any prefix through the block table
            dense_case = Case("dense_prefill_attention", dict(case.config), unit="TFLOP/s")

            def body_dense(case: Case, n=n, prefix=prefix, q_len=q_len, seq_len=seq_len) -> None:
                q, k_cache, v_cache, table, seq_lens, qsl = self._prefill_inputs(
                    n, q_len, seq_len, H, Hkv, D, bs
                )
                # k, v: [n * q_len, Hkv, D], what store_kv wrote for the chunk
                k = k_cache[table.long()].flatten(1, 2)[:, prefix:seq_len].flatten(0, 1)
                v = v_cache[table.long()].flatten(1, 2)[:, prefix:seq_len].flatten(0, 1)
                out = torch.empty_like(q)
                args = (q, k, v, k_cache, v_cache, table, seq_lens, qsl, q_len, scale)

                def run() -> None:
                    self.dense.dense_prefill_attention(*args, out=out)

                ref_args = (q, k_cache, v_cache, table, seq_lens, qsl, q_len, scale)
                work = causal_prefill_flops(n, prefix, q_len, H, D)
                self._check_and_time_prefill(case, run, out, ref_args, work)
                case.note = f"default config {self.dense.default_config(self.dtype, D)}"

            self.run_case(dense_case, body_dense)

    # -- prefill attention on 1 x 8192 causal: the issue-15 target ------------------------------
    def bench_prefill_8k(self) -> None:
        """The old paged path, the dense path's default and every config in its sweep, and
        PyTorch's SDPA (flash) on one 8192-token causal prompt with Llama-3.1-8B attention, each
        as TFLOP/s and % of the measured bf16 matmul ceiling (target: >= 70 %). q/k/v are views
        of one fused qkv buffer, as the engine passes them."""
        import torch.nn.functional as F

        if self.smoke:
            L, H, Hkv, D, bs = 80, 4, 2, 64, 16
            sweep = [
                self.dense.PrefillConfig(32, 16, 4, 2),
                self.dense.PrefillConfig(32, 16, 4, 2, True),
            ]
        else:
            L, H, Hkv, D, bs = 8192, 32, 8, 128, 16
            sweep = list(self.dense.CONFIGS_TO_SWEEP)
        print(f"-- prefill 1 x {L} causal: q heads {H}, kv heads {Hkv}, head_dim {D}, block {bs}")
        scale = D**-0.5
        group = H // Hkv
        flops = causal_prefill_flops(1, 0, L, H, D)
        qkv = self.randn(L, H + 2 * Hkv, D)
        q, k, v = qkv.split([H, Hkv, Hkv], dim=1)  # the engine's strided views
        nb = triton_cdiv(L, bs)
        perm = torch.randperm(nb, device=self.device, generator=self.gen)
        table = perm.view(1, nb).to(torch.int32)
        k_cache = torch.zeros(nb, bs, Hkv, D, dtype=self.dtype, device=self.device)
        v_cache = torch.zeros_like(k_cache)
        slots = (table[0].long()[:, None] * bs + torch.arange(bs, device=self.device)).flatten()
        self.kv.store_kv(k, v, k_cache, v_cache, slots[:L].contiguous())
        seq_lens = torch.tensor([L], dtype=torch.int32, device=self.device)
        qsl = torch.tensor([0, L], dtype=torch.int32, device=self.device)
        ref = self.pre.paged_prefill_attention_ref(
            q, k_cache, v_cache, table, seq_lens, qsl, L, scale
        )
        rows: dict[str, Any] = {}

        def add(name: str, label: str, run, note: str = "", check: bool = True) -> None:
            case = Case(
                name, {"shape": f"1x{L} {label}", "H": H, "Hkv": Hkv, "D": D, "bs": bs,
                       "dtype": str(self.dtype), "show": ["shape"]},
                unit="TFLOP/s", note=note,
            )  # fmt: skip

            def body(case: Case) -> None:
                out = run()
                if check:
                    case.check = rel_error(out, ref, self.dtype)
                case.work, case.peak = flops, self.matmul_tflops
                case.triton_ms = self.time_ms(run)

            self.run_case(case, body)
            d = case.as_dict()
            rows[label] = {"ms": case.triton_ms, "tflops": d["triton_rate"],
                           "pct_of_matmul": d["triton_pct_of_peak"], "ok": d["check"].get("ok"),
                           "error": case.error}  # fmt: skip

        out = torch.empty_like(q)
        add("paged_prefill_attention", "paged", lambda: self.pre.paged_prefill_attention(
            q, k_cache, v_cache, table, seq_lens, qsl, L, scale, out=out))  # fmt: skip
        args = (q, k, v, k_cache, v_cache, table, seq_lens, qsl, L, scale)
        add("dense_prefill_attention", "dense default",
            lambda: self.dense.dense_prefill_attention(*args, out=out),
            note=str(self.dense.default_config(self.dtype, D)))  # fmt: skip
        for cfg in sweep:
            label = "dense " + self.dense.config_label(cfg)
            add("dense_prefill_attention", label,
                lambda cfg=cfg: self.dense.dense_prefill_attention(*args, out=out, config=cfg),
                note="BLOCK_M/BLOCK_N/num_warps/num_stages")  # fmt: skip
        if self.cuda:
            qd = q.transpose(0, 1).unsqueeze(0)  # [1, H, L, D]
            kd = k.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0).contiguous()
            vd = v.repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0).contiguous()
            qd = qd.contiguous()
            add("sdpa_flash", "sdpa", lambda: F.scaled_dot_product_attention(
                qd, kd, vd, is_causal=True), note="dense K/V pre-expanded to all heads",
                check=False)  # fmt: skip
        dense_rows = {k: r for k, r in rows.items() if k.startswith("dense") and r["tflops"]
                      and r["ok"]}  # fmt: skip
        best = max(dense_rows, key=lambda k: dense_rows[k]["tflops"], default=None)
        self.prefill_8k = {
            "shape": {"L": L, "H": H, "Hkv": Hkv, "D": D, "block_size": bs, "causal": True},
            "flops": flops,
            "matmul_bf16_TFLOPs": self.matmul_tflops,
            "target_pct_of_matmul": 70.0,
            "rows": rows,
            "best_dense": best,
            "default_meets_target": (rows.get("dense default", {}).get("pct_of_matmul") or 0)
            >= 70.0,
        }
        print(f"prefill 1x{L}: matmul ceiling {self.matmul_tflops:.1f} TFLOP/s; "
              + "; ".join(f"{k} {r['pct_of_matmul']:.0f}%" for k, r in rows.items()
                          if r["pct_of_matmul"]) + f"; best dense: {best}")  # fmt: skip

    # -- every dense prefill variant, each probed in a child process first ----------------------
    def bench_prefill_sweep(self) -> None:
        from benchmarks.sweeps.prefill_sweep import run_sweep

        self.prefill_sweep = run_sweep(self.matmul_tflops, self.smoke)

    # -- memory-bound elementwise kernels -----------------------------------------------------
    def bench_elementwise(self) -> None:
        elt = torch.empty((), dtype=self.dtype).element_size()
        if self.smoke:
            token_counts, Hkv, H, D, hidden, inter, bs = [4], 2, 4, 64, 256, 128, 16
        else:
            token_counts, Hkv, H, D, hidden, inter, bs = [64, 8192], 8, 32, 128, 4096, 14336, 16

        print(f"-- memory-bound kernels, {self.dtype}")
        for T in token_counts:
            # store_kv: T new tokens into random slots of a cache (bf16, and e4m3: FP8 KV)
            for cache_dtype in (self.dtype, torch.float8_e4m3fn):
                fp8 = cache_dtype == torch.float8_e4m3fn
                case = Case(
                    "store_kv" + ("[e4m3]" if fp8 else ""),
                    {"T": T, "Hkv": Hkv, "D": D, "dtype": str(self.dtype)},
                )

                def body_kv(case: Case, T=T, cache_dtype=cache_dtype) -> None:
                    num_blocks = triton_cdiv(T, bs) * 2
                    k_cache = self.randn(num_blocks, bs, Hkv, D).to(cache_dtype)
                    v_cache = self.randn(num_blocks, bs, Hkv, D).to(cache_dtype)
                    key, value = self.randn(T, Hkv, D), self.randn(T, Hkv, D)
                    slots = torch.randperm(num_blocks * bs, device=self.device, generator=self.gen)
                    slots = slots[:T].contiguous()
                    k_ref, v_ref = k_cache.clone(), v_cache.clone()
                    self.kv.store_kv(key, value, k_cache, v_cache, slots)
                    self.kv.store_kv_ref(key, value, k_ref, v_ref, slots)
                    got, want = torch.cat([k_cache, v_cache]), torch.cat([k_ref, v_ref])
                    case.check = rel_error(got.float(), want.float(), self.dtype)
                    # read K, V in the model dtype, write them in the cache's
                    case.work = 2 * key.numel() * (elt + k_cache.element_size()) + T * 8
                    case.peak = self.copy_gbps
                    case.triton_ms = self.time_ms(
                        lambda: self.kv.store_kv(key, value, k_cache, v_cache, slots)
                    )
                    case.torch_impl = "store_kv_ref"
                    case.torch_ms = self.time_ms(
                        lambda: self.kv.store_kv_ref(key, value, k_ref, v_ref, slots)
                    )

                self.run_case(case, body_kv)

            # rms_norm with and without the fused residual add
            for fused in (True, False):
                case = Case(
                    "rms_norm" + ("+residual" if fused else ""),
                    {"T": T, "hidden": hidden, "dtype": str(self.dtype)},
                )

                def body_rms(case: Case, T=T, fused=fused) -> None:
                    x, w = self.randn(T, hidden), self.randn(hidden)
                    r = self.randn(T, hidden) if fused else None
                    got = self.rms.rms_norm(x, w, 1e-6, r)
                    exp = self.rms.rms_norm_ref(x, w, 1e-6, r)
                    if fused:
                        got, exp = torch.cat(got), torch.cat(exp)
                    case.check = rel_error(got, exp, self.dtype)
                    case.work = ((4 if fused else 2) * x.numel() + hidden) * elt
                    case.peak = self.copy_gbps
                    case.triton_ms = self.time_ms(lambda: self.rms.rms_norm(x, w, 1e-6, r))
                    case.torch_impl = "rms_norm_ref"
                    case.torch_ms = self.time_ms(lambda: self.rms.rms_norm_ref(x, w, 1e-6, r))

                self.run_case(case, body_rms)

            # rotary, in place on q and k
            case = Case(
                "apply_rotary", {"T": T, "H": H, "Hkv": Hkv, "D": D, "dtype": str(self.dtype)}
            )

            def body_rot(case: Case, T=T) -> None:
                max_pos = 8192
                cos_sin = self.cos_sin(max_pos, D)
                pos = torch.randint(0, max_pos, (T,), device=self.device, generator=self.gen)
                q, k = self.randn(T, H, D), self.randn(T, Hkv, D)
                q_ref, k_ref = self.rot.apply_rotary_ref(q.clone(), k.clone(), pos, cos_sin)
                self.rot.apply_rotary(q, k, pos, cos_sin)
                case.check = rel_error(torch.cat([q.flatten(), k.flatten()]),
                                       torch.cat([q_ref.flatten(), k_ref.flatten()]),
                                       self.dtype)  # fmt: skip
                case.work = 2 * (q.numel() + k.numel()) * elt + T * (D * 4 + 8)
                case.peak = self.copy_gbps
                case.triton_ms = self.time_ms(lambda: self.rot.apply_rotary(q, k, pos, cos_sin))
                case.torch_impl = "apply_rotary_ref"
                case.torch_ms = self.time_ms(
                    lambda: self.rot.apply_rotary_ref(q_ref, k_ref, pos, cos_sin)
                )

            self.run_case(case, body_rot)

            # rotary + the cache write in one pass (what attention runs first every layer)
            case = Case(
                "rotary_store_kv", {"T": T, "H": H, "Hkv": Hkv, "D": D, "dtype": str(self.dtype)}
            )

            def body_rot_kv(case: Case, T=T) -> None:
                max_pos = 8192
                cos_sin = self.cos_sin(max_pos, D)
                pos = torch.randint(0, max_pos, (T,), device=self.device, generator=self.gen)
                q, k, v = self.randn(T, H, D), self.randn(T, Hkv, D), self.randn(T, Hkv, D)
                num_blocks = triton_cdiv(T, bs) * 2
                caches = [self.randn(num_blocks, bs, Hkv, D) for _ in range(2)]
                slots = torch.randperm(num_blocks * bs, device=self.device, generator=self.gen)
                slots = slots[:T].contiguous()
                refs = [q.clone(), k.clone(), v.clone(), *(c.clone() for c in caches)]
                self.rkv.rotary_store_kv_ref(*refs[:3], pos, cos_sin, *refs[3:], slots)
                self.rkv.rotary_store_kv(q, k, v, pos, cos_sin, *caches, slots)
                got = torch.cat([t.flatten() for t in (q, k, *caches)])
                want = torch.cat([t.flatten() for t in (refs[0], refs[1], *refs[3:])])
                case.check = rel_error(got, want, self.dtype)
                # q and k read and written, v read, k and v written into the cache
                case.work = (2 * q.numel() + 5 * k.numel()) * elt + T * (D * 4 + 16)
                case.peak = self.copy_gbps
                case.triton_ms = self.time_ms(
                    lambda: self.rkv.rotary_store_kv(q, k, v, pos, cos_sin, *caches, slots)
                )
                case.torch_impl = "rotary_store_kv_ref"
                case.torch_ms = self.time_ms(
                    lambda: self.rkv.rotary_store_kv_ref(*refs[:3], pos, cos_sin, *refs[3:], slots)
                )

            self.run_case(case, body_rot_kv)

            # silu_and_mul
            case = Case("silu_and_mul", {"T": T, "inter": inter, "dtype": str(self.dtype)})

            def body_silu(case: Case, T=T) -> None:
                x = self.randn(T, 2 * inter)
                case.check = rel_error(
                    self.silu.silu_and_mul(x), self.silu.silu_and_mul_ref(x), self.dtype
                )
                case.work = 3 * T * inter * elt
                case.peak = self.copy_gbps
                case.triton_ms = self.time_ms(lambda: self.silu.silu_and_mul(x))
                case.torch_impl = "silu_and_mul_ref"
                case.torch_ms = self.time_ms(lambda: self.silu.silu_and_mul_ref(x))

            self.run_case(case, body_silu)

    # -- the decode step's projections at few rows -------------------------------------------
    def bench_skinny_gemm(self) -> None:
        """kernels/skinny_gemm.py (its default config) against F.linear (cuBLAS) at llama-3.1-8b's
        projections; rate: the weight streamed per call against the copy ceiling. One weight,
        so part of it may sit in L2 between calls: benchmarks/sweeps/skinny_gemm_sweep.py times the
        layer sequence cold, this is the quick check."""
        shapes = [("o", 4096, 4096), ("down", 4096, 14336), ("gate_up", 28672, 4096)]
        if self.smoke:
            shapes = [("tiny", 64, 256)]
        for name, n, k in shapes:
            for m in (1, 32) if self.smoke else (1, 16, 32, 64):
                case = Case("skinny_gemm", {"proj": name, "M": m, "N": n, "K": k})

                def body(case: Case, m=m, n=n, k=k) -> None:
                    x, w = self.randn(m, k), self.randn(n, k) / k**0.5
                    cfg = self.skinny.default_config(m, n, k)
                    out = self.skinny.skinny_gemm(x, w, config=cfg)
                    case.check = rel_error(out, self.skinny.skinny_gemm_ref(x, w), self.dtype)
                    case.work = n * k * x.element_size()
                    case.peak = self.copy_gbps
                    case.note = f"split_k={cfg.split_k} stages={cfg.num_stages}"
                    case.triton_ms = self.time_ms(
                        lambda: self.skinny.skinny_gemm(x, w, out=out, config=cfg)
                    )
                    case.torch_impl = "F.linear"
                    case.torch_ms = self.time_ms(lambda: torch.nn.functional.linear(x, w))

                self.run_case(case, body)

    # -- FP8: activation quantization, the e4m3 KV cache, the FP8 linear ----------------------
    def bench_fp8(self) -> None:
        """Per-token e4m3 quantization (every FP8 linear's input), decode attention over an e4m3
        cache (compare with the bf16 `decode` rows; stores into it are in `elementwise`), and
        the FP8 linear (quantize + torch._scaled_mm) against a bf16 matmul of the same shape."""
        from engine.models.fp8 import fp8_linear, fp8_matmul_ref, quantize_weight

        fp8 = torch.float8_e4m3fn
        if self.smoke:
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
            case = Case("quantize_fp8", {"T": T, "K": K, "dtype": str(self.dtype)})

            def body_quant(case: Case, T=T) -> None:
                x = self.randn(T, K)
                q, scale = self.fp8.quantize_fp8(x)
                q_ref, scale_ref = self.fp8.quantize_fp8_ref(x)
                case.check = rel_error(q.float() * scale, q_ref.float() * scale_ref, self.dtype)
                case.work = x.numel() * (x.element_size() * 2 + 1) + T * 4  # amax pass, quant pass
                case.peak = self.copy_gbps
                case.triton_ms = self.time_ms(lambda: self.fp8.quantize_fp8(x))
                case.torch_impl = "quantize_fp8_ref"
                case.torch_ms = self.time_ms(lambda: self.fp8.quantize_fp8_ref(x))

            self.run_case(case, body_quant)

            case = Case("fp8_linear", {"T": T, "K": K, "N": N, "dtype": str(self.dtype)})
            case.unit = "TFLOP/s"

            def body_linear(case: Case, T=T) -> None:
                x = self.randn(T, K)
                w = self.randn(N, K) * 0.02
                w_q, w_scale = quantize_weight(w)
                got = fp8_linear(x, w_q, w_scale)
                x_q, x_scale = self.fp8.quantize_fp8_ref(x)
                case.check = rel_error(got, fp8_matmul_ref(x_q, x_scale, w_q, w_scale, x.dtype),
                                       self.dtype)  # fmt: skip
                case.work = 2 * T * K * N
                case.peak = self.matmul_tflops
                case.triton_ms = self.time_ms(lambda: fp8_linear(x, w_q, w_scale))
                case.torch_impl = "bf16 F.linear"
                case.torch_ms = self.time_ms(lambda: torch.nn.functional.linear(x, w))
                case.note = "triton column: quantize_fp8 + torch._scaled_mm (CUDA sm89+)"

            self.run_case(case, body_linear)

        self.bench_fused_fp8_quant()

        case = Case(
            "paged_decode_attention[e4m3]",
            {"shape": f"B={batch} ctx={ctx}", "H": H, "Hkv": Hkv, "D": D, "bs": bs,
             "show": ["shape"], "dtype": str(self.dtype)},
        )  # fmt: skip

        def body_decode(case: Case) -> None:
            nb = triton_cdiv(ctx, bs)
            k_cache = self.randn(batch * nb, bs, Hkv, D).to(fp8)
            v_cache = self.randn(batch * nb, bs, Hkv, D).to(fp8)
            perm = torch.randperm(batch * nb, device=self.device, generator=self.gen)
            table = perm.view(batch, nb).to(torch.int32)
            seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=self.device)
            q = self.randn(batch, H, D)
            out = torch.empty_like(q)

            def run() -> None:
                self.dec.paged_decode_attention(
                    q, k_cache, v_cache, table, seq_lens, D**-0.5, max_seq_len=ctx, out=out,
                    k_scale=0.5, v_scale=2.0,
                )  # fmt: skip

            run()
            rows = min(batch, 8)
            ref = self.dec.paged_decode_attention_ref(
                q[:rows], k_cache, v_cache, table[:rows], seq_lens[:rows], D**-0.5,
                k_scale=0.5, v_scale=2.0,
            )  # fmt: skip
            case.check = rel_error(out[:rows], ref, self.dtype)
            case.work = batch * ctx * 2 * Hkv * D + 2 * q.numel() * q.element_size()
            case.peak = self.copy_gbps
            case.triton_ms = self.time_ms(run)
            case.note = "half the K/V bytes of the bf16 decode row at the same shape"

        self.run_case(case, body_decode)

    def bench_fused_fp8_quant(self) -> None:
        """The ops that feed the decode step's FP8 linears with the per-row e4m3 quantization
        fused in (rms_norm_fp8 with the residual add, before qkv and gate_up; silu_and_mul_fp8
        before down) at llama-3.1-70b's widths, against the same op then quantize_fp8 (the
        torch column: two Triton launches, the path for more than FP8_SKINNY_MAX_ROWS rows),
        checked against that pair (the same bits: rel_l2 0; tests/kernels check the torch
        twins). Rate: the fused kernel's bytes (inputs read once, e4m3 and scales written)."""
        from kernels.skinny_gemm import FP8_SKINNY_MAX_ROWS

        if self.smoke:
            rows, hidden, inter = [4], 256, 320
        else:
            rows, hidden, inter = [1, 16, FP8_SKINNY_MAX_ROWS], 8192, 28672
        elt = torch.empty((), dtype=self.dtype).element_size()
        for T in rows:
            case = Case("rms_norm_fp8+residual", {"T": T, "hidden": hidden})

            def body_norm(case: Case, T=T) -> None:
                x, res = self.randn(T, hidden), self.randn(T, hidden)
                w = 1 + 0.1 * self.randn(hidden)
                got = self.rms.rms_norm_fp8(x, w, 1e-5, res)
                want = self.fp8.quantize_fp8(self.rms.rms_norm(x, w, 1e-5, res)[0])
                case.check = rel_error(got[0].float() * got[1], want[0].float() * want[1],
                                       self.dtype)  # fmt: skip
                case.work = T * hidden * (3 * elt + 1) + hidden * elt + T * 4
                case.peak = self.copy_gbps
                case.triton_ms = self.time_ms(lambda: self.rms.rms_norm_fp8(x, w, 1e-5, res))
                case.torch_impl = "rms_norm + quantize_fp8 (Triton)"
                case.torch_ms = self.time_ms(
                    lambda: self.fp8.quantize_fp8(self.rms.rms_norm(x, w, 1e-5, res)[0])
                )

            self.run_case(case, body_norm)

            case = Case("silu_and_mul_fp8", {"T": T, "inter": inter})

            def body_silu(case: Case, T=T) -> None:
                x = self.randn(T, 2 * inter)
                got = self.silu.silu_and_mul_fp8(x)
                want = self.fp8.quantize_fp8(self.silu.silu_and_mul(x))
                case.check = rel_error(got[0].float() * got[1], want[0].float() * want[1],
                                       self.dtype)  # fmt: skip
                case.work = T * inter * (2 * elt + 1) + T * 4
                case.peak = self.copy_gbps
                case.triton_ms = self.time_ms(lambda: self.silu.silu_and_mul_fp8(x))
                case.torch_impl = "silu_and_mul + quantize_fp8 (Triton)"
                case.torch_ms = self.time_ms(
                    lambda: self.fp8.quantize_fp8(self.silu.silu_and_mul(x))
                )
                case.note = "one program per row, two passes over the row (silu_mul.py)"

            self.run_case(case, body_silu)

    # -- driver -------------------------------------------------------------------------------
    def run(self, only: set[str] | None) -> dict[str, Any]:
        t0 = time.perf_counter()
        name = torch.cuda.get_device_name() if self.cuda else "cpu (TRITON_INTERPRET)"
        print(
            f"device: {name} | torch {torch.__version__} | triton {self.triton.__version__}"
            + (" | SMOKE (tiny shapes, wall-clock single runs)" if self.smoke else "")
        )
        self.measure_peaks()
        self.print_header()
        sections = {
            "decode": self.bench_decode,
            "decode_splits": self.bench_decode_splits,
            "prefill": self.bench_prefill,
            "prefill_8k": self.bench_prefill_8k,
            "elementwise": self.bench_elementwise,
            "skinny_gemm": self.bench_skinny_gemm,
            "fp8": self.bench_fp8,
            "prefill_sweep": self.bench_prefill_sweep,
        }
        opt_in = {"prefill_sweep"}  # long: only when --only names it
        for key, fn in sections.items():
            if (only and key not in only) or (not only and key in opt_in):
                continue
            try:
                fn()
            except Exception as e:  # a broken section must not hide the others
                traceback.print_exc()
                self.cases.append(Case(key, {}, error=f"{type(e).__name__}: {e}"))
        elapsed = time.perf_counter() - t0
        print(f"done in {elapsed:.1f}s")
        return {
            "device": name,
            "torch": torch.__version__,
            "triton": self.triton.__version__,
            "smoke": self.smoke,
            "dtype": str(self.dtype),
            "timing": "triton.testing.do_bench median" if self.cuda else "wall clock, 1 run",
            "copy_GBps": self.copy_gbps,
            "matmul_bf16_TFLOPs": self.matmul_tflops,
            "elapsed_s": elapsed,
            "prefill_8k": self.prefill_8k,
            "prefill_sweep": self.prefill_sweep,
            "results": [c.as_dict() for c in self.cases],
        }


def causal_prefill_flops(n: int, prefix: int, q_len: int, heads: int, head_dim: int) -> float:
    """QK^T and PV (2 FLOPs per MAC each) of n chunks of q_len queries after `prefix` cached
    keys: the query at chunk position j sees prefix + j + 1 keys."""
    keys_seen = q_len * (prefix + 1) + q_len * (q_len - 1) // 2
    return 4.0 * n * keys_seen * heads * head_dim


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (runs on CPU too)")
    parser.add_argument(
        "--only",
        default="",
        help="comma list of sections: decode,decode_splits,prefill,prefill_8k,elementwise,fp8,"
        "prefill_sweep (opt-in)",
    )
    parser.add_argument("--warmup-ms", type=int, default=25)
    parser.add_argument("--rep-ms", type=int, default=100)
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        if not args.smoke:
            print("no CUDA device: run with --smoke for the interpreter check", file=sys.stderr)
            return 2
        # must precede the first import of the kernels (decided when @triton.jit runs)
        os.environ.setdefault("TRITON_INTERPRET", "1")

    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    bench = Bench(args.smoke, args.warmup_ms, args.rep_ms)
    report = bench.run(only)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    failed = [r for r in report["results"] if r["error"] or not r["check"].get("ok", True)]
    for r in failed:
        print(f"FAILED: {r['kernel']} {r['config']} {r['error'] or r['check']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
