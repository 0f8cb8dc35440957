"""Prefill attention: the paged kernel by chunk shape, the dense variants on 1 x 8192 causal
(the issue-15 target), and the opt-in sweep of every dense variant."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.kernel_bench.harness import (
    Bench,
    Case,
    causal_prefill_flops,
    rel_error,
    triton_cdiv,
)


# paged prefill attention
def check_and_time_prefill(
    bench: Bench, case: Case, run, out, ref_args: tuple, work: float
) -> None:
    """Run once, check `out` against the paged torch reference, then time `run`."""
    run()
    ref = bench.pre.paged_prefill_attention_ref(*ref_args)
    case.check = rel_error(out, ref, bench.dtype)
    del ref
    case.work, case.peak = work, bench.matmul_tflops
    case.triton_ms = bench.time_ms(run)


def prefill_inputs(
    bench: Bench, n: int, q_len: int, seq_len: int, H: int, Hkv: int, D: int, bs: int
):
    """n sequences of seq_len keys in a shuffled paged cache, each with a q_len-token chunk:
    q [n * q_len, H, D], k_cache / v_cache, block table, seq_lens, query_start_loc."""
    blocks_per_seq = triton_cdiv(seq_len, bs)
    num_blocks = n * blocks_per_seq
    k_cache = bench.randn(num_blocks, bs, Hkv, D)
    v_cache = bench.randn(num_blocks, bs, Hkv, D)
    perm = torch.randperm(num_blocks, device=bench.device, generator=bench.gen)
    table = perm.view(n, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((n,), seq_len, dtype=torch.int32, device=bench.device)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=bench.device) * q_len
    return bench.randn(n * q_len, H, D), k_cache, v_cache, table, seq_lens, qsl


def time_paged_prefill(
    bench: Bench, case: Case, n: int, q_len: int, seq_len: int, dims: tuple, num_splits: int = 1
) -> tuple:
    """Time the paged kernel on prefill_inputs' shape (dims: H, Hkv, D, block size); its
    inputs, for the torch baselines."""
    H, Hkv, D, bs = dims
    inputs = prefill_inputs(bench, n, q_len, seq_len, H, Hkv, D, bs)
    q, k_cache, v_cache, table, seq_lens, qsl = inputs
    out, scale = torch.empty_like(q), D**-0.5
    args = (q, k_cache, v_cache, table, seq_lens, qsl, q_len, scale)

    def run() -> None:
        bench.pre.paged_prefill_attention(*args, out=out, num_splits=num_splits)

    work = causal_prefill_flops(n, seq_len - q_len, q_len, H, D)
    check_and_time_prefill(bench, case, run, out, args, work)
    return inputs


def bench_prefill(bench: Bench) -> None:
    import torch.nn.functional as F

    if bench.smoke:
        H, Hkv, D, bs = 4, 2, 64, 16
        full = [(1, 48), (2, 30)]
        chunked = [(2, 40, 8)]
    else:
        H, Hkv, D, bs = 32, 8, 128, 16
        full = [(1, 4096), (4, 2048), (16, 512), (1, 8192)]
        # (seqs, cached prefix, chunk); the last: a long document's third 8k chunk
        chunked = [(4, 3584, 512), (16, 1024, 128), (1, 16384, 8192)]
    print(f"-- prefill: q heads {H}, kv heads {Hkv}, head_dim {D}, block {bs}, {bench.dtype}")
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
                "dtype": str(bench.dtype),
                "show": ["shape"],
            },
            unit="TFLOP/s",
        )

        def body(case: Case, n=n, prefix=prefix, q_len=q_len, seq_len=seq_len) -> None:
            dims = (H, Hkv, D, bs)
            q, k_cache, v_cache, table, seq_lens, qsl = time_paged_prefill(
                bench, case, n, q_len, seq_len, dims
            )
            if prefix == 0:
                # dense flash baseline: K/V already gathered and expanded to all heads
                k = k_cache[table.long()].flatten(1, 2)[:, :seq_len]  # [n, L, Hkv, D]
                v = v_cache[table.long()].flatten(1, 2)[:, :seq_len]
                k = k.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
                v = v.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
                qd = q.view(n, q_len, H, D).transpose(1, 2).contiguous()
                case.torch_impl = "F.scaled_dot_product_attention(is_causal)"
                case.torch_ms = bench.time_ms(
                    lambda: F.scaled_dot_product_attention(qd, k, v, is_causal=True)
                )
            else:
                ref_out = torch.empty_like(q)
                case.torch_impl = "paged_prefill_attention_ref"
                case.torch_ms = bench.time_ms(
                    lambda: bench.pre.paged_prefill_attention_ref(
                        q, k_cache, v_cache, table, seq_lens, qsl, q_len, scale, out=ref_out
                    )
                )

        bench.run_case(case, body)

        # the dense path on the same shape (the engine's choice for a float cache): the
        # chunk's k/v rows as this step's new tokens, any prefix through the block table
        dense_case = Case("dense_prefill_attention", dict(case.config), unit="TFLOP/s")

        def body_dense(case: Case, n=n, prefix=prefix, q_len=q_len, seq_len=seq_len) -> None:
            q, k_cache, v_cache, table, seq_lens, qsl = prefill_inputs(
                bench, n, q_len, seq_len, H, Hkv, D, bs
            )
            # k, v: [n * q_len, Hkv, D], what store_kv wrote for the chunk
            k = k_cache[table.long()].flatten(1, 2)[:, prefix:seq_len].flatten(0, 1)
            v = v_cache[table.long()].flatten(1, 2)[:, prefix:seq_len].flatten(0, 1)
            out = torch.empty_like(q)
            args = (q, k, v, k_cache, v_cache, table, seq_lens, qsl, q_len, scale)

            def run() -> None:
                bench.dense.dense_prefill_attention(*args, out=out)

            ref_args = (q, k_cache, v_cache, table, seq_lens, qsl, q_len, scale)
            work = causal_prefill_flops(n, prefix, q_len, H, D)
            check_and_time_prefill(bench, case, run, out, ref_args, work)
            case.note = f"default config {bench.dense.default_config(bench.dtype, D)}"

        bench.run_case(dense_case, body_dense)


# short chunks over long prefixes: one key range against the split ones
def bench_prefill_split(bench: Bench) -> None:
    """A document's chunk beside running decodes (the engine's paced share): few row tiles, a
    long prefix. The paged kernel with one key range, with prefill_num_splits' count, and the
    dense kernel (the bf16 cache's default)."""
    if bench.smoke:
        H, Hkv, D, bs, num_sms = 4, 2, 64, 16, 8
        shapes = [(1, 8, 1100)]
    else:
        H, Hkv, D, bs = 32, 8, 128, 16
        num_sms = torch.cuda.get_device_properties(bench.device).multi_processor_count
        # (seqs, chunk, cached prefix): the H100's 8B document chunk, and neighbours
        shapes = [(1, 74, 21_526), (1, 128, 16_000), (2, 32, 8_000), (1, 512, 20_000)]
    print(f"-- prefill splits: q heads {H}, kv heads {Hkv}, head_dim {D}, {num_sms} SMs")
    for n, q_len, prefix in shapes:
        seq_len = prefix + q_len
        splits = bench.pre.prefill_num_splits(n, q_len, seq_len, H // Hkv, Hkv, num_sms)
        for label, count in (("one range", 1), (f"{splits} splits", splits)):
            config = {"shape": f"{n}x{q_len} +prefix {prefix}", "splits": label,
                      "show": ["shape", "splits"]}  # fmt: skip
            case = Case("paged_prefill_attention", config, unit="TFLOP/s")

            def body(case: Case, n=n, q_len=q_len, seq_len=seq_len, count=count) -> None:
                time_paged_prefill(bench, case, n, q_len, seq_len, (H, Hkv, D, bs), count)

            bench.run_case(case, body)


# prefill attention on 1 x 8192 causal: the issue-15 target
def bench_prefill_8k(bench: Bench) -> None:
    """The old paged path, the dense path's default and every config in its sweep, and
    PyTorch's SDPA (flash) on one 8192-token causal prompt with Llama-3.1-8B attention, each
    as TFLOP/s and % of the measured bf16 matmul ceiling (target: >= 70 %). q/k/v are views
    of one fused qkv buffer, as the engine passes them."""
    import torch.nn.functional as F

    if bench.smoke:
        L, H, Hkv, D, bs = 80, 4, 2, 64, 16
        sweep = [
            bench.dense.PrefillConfig(32, 16, 4, 2),
            bench.dense.PrefillConfig(32, 16, 4, 2, True),
        ]
    else:
        L, H, Hkv, D, bs = 8192, 32, 8, 128, 16
        sweep = list(bench.dense.CONFIGS_TO_SWEEP)
    print(f"-- prefill 1 x {L} causal: q heads {H}, kv heads {Hkv}, head_dim {D}, block {bs}")
    scale = D**-0.5
    group = H // Hkv
    flops = causal_prefill_flops(1, 0, L, H, D)
    qkv = bench.randn(L, H + 2 * Hkv, D)
    q, k, v = qkv.split([H, Hkv, Hkv], dim=1)  # the engine's strided views
    nb = triton_cdiv(L, bs)
    perm = torch.randperm(nb, device=bench.device, generator=bench.gen)
    table = perm.view(1, nb).to(torch.int32)
    k_cache = torch.zeros(nb, bs, Hkv, D, dtype=bench.dtype, device=bench.device)
    v_cache = torch.zeros_like(k_cache)
    slots = (table[0].long()[:, None] * bs + torch.arange(bs, device=bench.device)).flatten()
    bench.kv.store_kv(k, v, k_cache, v_cache, slots[:L].contiguous())
    seq_lens = torch.tensor([L], dtype=torch.int32, device=bench.device)
    qsl = torch.tensor([0, L], dtype=torch.int32, device=bench.device)
    ref = bench.pre.paged_prefill_attention_ref(q, k_cache, v_cache, table, seq_lens, qsl, L, scale)
    rows: dict[str, Any] = {}

    def add(name: str, label: str, run, note: str = "", check: bool = True) -> None:
        case = Case(
            name, {"shape": f"1x{L} {label}", "H": H, "Hkv": Hkv, "D": D, "bs": bs,
                   "dtype": str(bench.dtype), "show": ["shape"]},
            unit="TFLOP/s", note=note,
        )  # fmt: skip

        def body(case: Case) -> None:
            out = run()
            if check:
                case.check = rel_error(out, ref, bench.dtype)
            case.work, case.peak = flops, bench.matmul_tflops
            case.triton_ms = bench.time_ms(run)

        bench.run_case(case, body)
        d = case.as_dict()
        rows[label] = {"ms": case.triton_ms, "tflops": d["triton_rate"],
                       "pct_of_matmul": d["triton_pct_of_peak"], "ok": d["check"].get("ok"),
                       "error": case.error}  # fmt: skip

    out = torch.empty_like(q)
    add("paged_prefill_attention", "paged", lambda: bench.pre.paged_prefill_attention(
        q, k_cache, v_cache, table, seq_lens, qsl, L, scale, out=out))  # fmt: skip
    args = (q, k, v, k_cache, v_cache, table, seq_lens, qsl, L, scale)
    add("dense_prefill_attention", "dense default",
        lambda: bench.dense.dense_prefill_attention(*args, out=out),
        note=str(bench.dense.default_config(bench.dtype, D)))  # fmt: skip
    for cfg in sweep:
        label = "dense " + bench.dense.config_label(cfg)
        add("dense_prefill_attention", label,
            lambda cfg=cfg: bench.dense.dense_prefill_attention(*args, out=out, config=cfg),
            note="BLOCK_M/BLOCK_N/num_warps/num_stages")  # fmt: skip
    if bench.cuda:
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
    bench.prefill_8k = {
        "shape": {"L": L, "H": H, "Hkv": Hkv, "D": D, "block_size": bs, "causal": True},
        "flops": flops,
        "matmul_bf16_TFLOPs": bench.matmul_tflops,
        "target_pct_of_matmul": 70.0,
        "rows": rows,
        "best_dense": best,
        "default_meets_target": (rows.get("dense default", {}).get("pct_of_matmul") or 0) >= 70.0,
    }
    print(f"prefill 1x{L}: matmul ceiling {bench.matmul_tflops:.1f} TFLOP/s; "
          + "; ".join(f"{k} {r['pct_of_matmul']:.0f}%" for k, r in rows.items()
                      if r["pct_of_matmul"]) + f"; best dense: {best}")  # fmt: skip


# every dense prefill variant, each probed in a child process first
def bench_prefill_sweep(bench: Bench) -> None:
    from benchmarks.sweeps.prefill_sweep import run_sweep

    bench.prefill_sweep = run_sweep(bench.matmul_tflops, bench.smoke)
