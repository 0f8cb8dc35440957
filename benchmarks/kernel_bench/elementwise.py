"""Memory-bound elementwise kernels (KV store, RMS norm, rotary, SiLU-and-mul, the grammar
mask) against their torch twins, as GB/s of the copy ceiling."""

from __future__ import annotations

import torch

from benchmarks.kernel_bench.harness import Bench, Case, rel_error, triton_cdiv


# memory-bound elementwise kernels
def bench_elementwise(bench: Bench) -> None:
    elt = torch.empty((), dtype=bench.dtype).element_size()
    if bench.smoke:
        token_counts, Hkv, H, D, hidden, inter, bs = [4], 2, 4, 64, 256, 128, 16
    else:
        token_counts, Hkv, H, D, hidden, inter, bs = [64, 8192], 8, 32, 128, 4096, 14336, 16

    print(f"-- memory-bound kernels, {bench.dtype}")
    for T in token_counts:
        # store_kv: T new tokens into random slots of a cache (bf16, and e4m3: FP8 KV)
        for cache_dtype in (bench.dtype, torch.float8_e4m3fn):
            fp8 = cache_dtype == torch.float8_e4m3fn
            case = Case(
                "store_kv" + ("[e4m3]" if fp8 else ""),
                {"T": T, "Hkv": Hkv, "D": D, "dtype": str(bench.dtype)},
            )

            def body_kv(case: Case, T=T, cache_dtype=cache_dtype) -> None:
                num_blocks = triton_cdiv(T, bs) * 2
                k_cache = bench.randn(num_blocks, bs, Hkv, D).to(cache_dtype)
                v_cache = bench.randn(num_blocks, bs, Hkv, D).to(cache_dtype)
                key, value = bench.randn(T, Hkv, D), bench.randn(T, Hkv, D)
                slots = torch.randperm(num_blocks * bs, device=bench.device, generator=bench.gen)
                slots = slots[:T].contiguous()
                k_ref, v_ref = k_cache.clone(), v_cache.clone()
                bench.kv.store_kv(key, value, k_cache, v_cache, slots)
                bench.kv.store_kv_ref(key, value, k_ref, v_ref, slots)
                got, want = torch.cat([k_cache, v_cache]), torch.cat([k_ref, v_ref])
                case.check = rel_error(got.float(), want.float(), bench.dtype)
                # read K, V in the model dtype, write them in the cache's
                case.work = 2 * key.numel() * (elt + k_cache.element_size()) + T * 8
                case.peak = bench.copy_gbps
                case.triton_ms = bench.time_ms(
                    lambda: bench.kv.store_kv(key, value, k_cache, v_cache, slots)
                )
                case.torch_impl = "store_kv_ref"
                case.torch_ms = bench.time_ms(
                    lambda: bench.kv.store_kv_ref(key, value, k_ref, v_ref, slots)
                )

            bench.run_case(case, body_kv)

        # rms_norm with and without the fused residual add
        for fused in (True, False):
            case = Case(
                "rms_norm" + ("+residual" if fused else ""),
                {"T": T, "hidden": hidden, "dtype": str(bench.dtype)},
            )

            def body_rms(case: Case, T=T, fused=fused) -> None:
                x, w = bench.randn(T, hidden), bench.randn(hidden)
                r = bench.randn(T, hidden) if fused else None
                got = bench.rms.rms_norm(x, w, 1e-6, r)
                exp = bench.rms.rms_norm_ref(x, w, 1e-6, r)
                if fused:
                    got, exp = torch.cat(got), torch.cat(exp)
                case.check = rel_error(got, exp, bench.dtype)
                case.work = ((4 if fused else 2) * x.numel() + hidden) * elt
                case.peak = bench.copy_gbps
                case.triton_ms = bench.time_ms(lambda: bench.rms.rms_norm(x, w, 1e-6, r))
                case.torch_impl = "rms_norm_ref"
                case.torch_ms = bench.time_ms(lambda: bench.rms.rms_norm_ref(x, w, 1e-6, r))

            bench.run_case(case, body_rms)

        # rotary, in place on q and k
        case = Case("apply_rotary", {"T": T, "H": H, "Hkv": Hkv, "D": D, "dtype": str(bench.dtype)})

        def body_rot(case: Case, T=T) -> None:
            max_pos = 8192
            cos_sin = bench.cos_sin(max_pos, D)
            pos = torch.randint(0, max_pos, (T,), device=bench.device, generator=bench.gen)
            q, k = bench.randn(T, H, D), bench.randn(T, Hkv, D)
            q_ref, k_ref = bench.rot.apply_rotary_ref(q.clone(), k.clone(), pos, cos_sin)
            bench.rot.apply_rotary(q, k, pos, cos_sin)
            case.check = rel_error(torch.cat([q.flatten(), k.flatten()]),
                                   torch.cat([q_ref.flatten(), k_ref.flatten()]),
                                   bench.dtype)  # fmt: skip
            case.work = 2 * (q.numel() + k.numel()) * elt + T * (D * 4 + 8)
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(lambda: bench.rot.apply_rotary(q, k, pos, cos_sin))
            case.torch_impl = "apply_rotary_ref"
            case.torch_ms = bench.time_ms(
                lambda: bench.rot.apply_rotary_ref(q_ref, k_ref, pos, cos_sin)
            )

        bench.run_case(case, body_rot)

        # rotary + the cache write in one pass (what attention runs first every layer)
        case = Case(
            "rotary_store_kv", {"T": T, "H": H, "Hkv": Hkv, "D": D, "dtype": str(bench.dtype)}
        )

        def body_rot_kv(case: Case, T=T) -> None:
            max_pos = 8192
            cos_sin = bench.cos_sin(max_pos, D)
            pos = torch.randint(0, max_pos, (T,), device=bench.device, generator=bench.gen)
            q, k, v = bench.randn(T, H, D), bench.randn(T, Hkv, D), bench.randn(T, Hkv, D)
            num_blocks = triton_cdiv(T, bs) * 2
            caches = [bench.randn(num_blocks, bs, Hkv, D) for _ in range(2)]
            slots = torch.randperm(num_blocks * bs, device=bench.device, generator=bench.gen)
            slots = slots[:T].contiguous()
            refs = [q.clone(), k.clone(), v.clone(), *(c.clone() for c in caches)]
            bench.rkv.rotary_store_kv_ref(*refs[:3], pos, cos_sin, *refs[3:], slots)
            bench.rkv.rotary_store_kv(q, k, v, pos, cos_sin, *caches, slots)
            got = torch.cat([t.flatten() for t in (q, k, *caches)])
            want = torch.cat([t.flatten() for t in (refs[0], refs[1], *refs[3:])])
            case.check = rel_error(got, want, bench.dtype)
            # q and k read and written, v read, k and v written into the cache
            case.work = (2 * q.numel() + 5 * k.numel()) * elt + T * (D * 4 + 16)
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(
                lambda: bench.rkv.rotary_store_kv(q, k, v, pos, cos_sin, *caches, slots)
            )
            case.torch_impl = "rotary_store_kv_ref"
            case.torch_ms = bench.time_ms(
                lambda: bench.rkv.rotary_store_kv_ref(*refs[:3], pos, cos_sin, *refs[3:], slots)
            )

        bench.run_case(case, body_rot_kv)

        # silu_and_mul
        case = Case("silu_and_mul", {"T": T, "inter": inter, "dtype": str(bench.dtype)})

        def body_silu(case: Case, T=T) -> None:
            x = bench.randn(T, 2 * inter)
            case.check = rel_error(
                bench.silu.silu_and_mul(x), bench.silu.silu_and_mul_ref(x), bench.dtype
            )
            case.work = 3 * T * inter * elt
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(lambda: bench.silu.silu_and_mul(x))
            case.torch_impl = "silu_and_mul_ref"
            case.torch_ms = bench.time_ms(lambda: bench.silu.silu_and_mul_ref(x))

        bench.run_case(case, body_silu)

    # the grammar mask, in place on float32 logits: every row constrained (no row ids) and every
    # other row (row ids), the Llama 3 vocabulary, about 1 token in 16 allowed
    rows, vocab = (4, 1000) if bench.smoke else (64, 128256)
    for with_row_ids in (False, True):
        config = {"rows": rows, "vocab": vocab, "row_ids": with_row_ids, "dtype": "float32"}
        case = Case("apply_token_bitmask", config)

        def body_mask(case: Case, with_row_ids=with_row_ids) -> None:
            n = rows // 2 if with_row_ids else rows
            logits = bench.randn(rows, vocab, dtype=torch.float32)
            shape, dev = (4, n, (vocab + 31) // 32), bench.device
            words = torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, device=dev,
                                  generator=bench.gen)  # fmt: skip
            bitmask = words[0] & words[1] & words[2] & words[3]  # each bit set with p = 1/16
            row_ids = torch.arange(1, rows, 2, device=dev) if with_row_ids else None
            got, want = logits.clone(), logits.clone()
            bench.bitmask.apply_token_bitmask(got, bitmask, row_ids)
            bench.bitmask.apply_token_bitmask_ref(want, bitmask, row_ids)
            same = bool(torch.equal(got, want))  # (-inf where banned: compared exactly)
            miss = 0.0 if same else float("inf")
            case.check = {"ok": same, "rel_l2": miss, "max_abs": miss}
            # the masked rows' logits read and written, their bitmasks read
            case.work = 2 * n * vocab * 4 + bitmask.numel() * 4
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(
                lambda: bench.bitmask.apply_token_bitmask(got, bitmask, row_ids)
            )
            case.torch_impl = "apply_token_bitmask_ref"
            case.torch_ms = bench.time_ms(
                lambda: bench.bitmask.apply_token_bitmask_ref(want, bitmask, row_ids)
            )

        bench.run_case(case, body_mask)
