"""Paged decode attention: the kernel against its torch twin, and split counts with a
straggler."""

from __future__ import annotations

import torch

from benchmarks.kernel_bench.harness import Bench, Case, rel_error, triton_cdiv


# paged decode attention
def bench_decode(bench: Bench) -> None:
    if bench.smoke:
        H, Hkv, D, bs = 4, 2, 64, 16
        grid = [(1, 40), (3, 100)]
        mixed = (3, 100)
    else:
        H, Hkv, D, bs = 32, 8, 128, 16
        grid = [(b, c) for b in (1, 16, 64, 256) for c in (512, 1024, 4096, 16384)]
        grid.remove((64, 4096))
        grid.insert(0, (64, 4096))  # the headline case first
        mixed = (64, 8192)
    print(f"-- decode: q heads {H}, kv heads {Hkv}, head_dim {D}, block {bs}, {bench.dtype}")
    scale = D**-0.5
    elt = torch.empty((), dtype=bench.dtype).element_size()
    bytes_per_token = 2 * Hkv * D * elt  # K + V
    cases = [(b, [c] * b, f"B={b} ctx={c}") for b, c in grid]
    g = torch.Generator().manual_seed(1)
    mixed_lens = torch.randint(1, mixed[1] + 1, (mixed[0],), generator=g).tolist()
    cases.append((mixed[0], mixed_lens, f"B={mixed[0]} ctx=U[1,{mixed[1]}]"))

    def blocks_for(lens: list[int]) -> int:
        return sum(triton_cdiv(n, bs) for n in lens)

    if bench.cuda:  # drop cases whose K/V would not fit (leaving room for the references)
        budget_blocks = int(0.6 * torch.cuda.mem_get_info()[0]) // (bs * bytes_per_token)
        for _, _lens, label in [c for c in cases if blocks_for(c[1]) > budget_blocks]:
            print(f"paged_decode_attention   {label}: skipped, K/V would not fit in memory")
        cases = [c for c in cases if blocks_for(c[1]) <= budget_blocks]
    num_blocks = max(blocks_for(lens) for _, lens, _ in cases)
    k_cache = bench.randn(num_blocks, bs, Hkv, D)
    v_cache = bench.randn(num_blocks, bs, Hkv, D)
    ref_token_limit = 64 * 4096 if not bench.smoke else 1 << 30  # torch ref timing budget
    check_rows = 8

    def make(batch: int, lens: list[int]):
        nb = [triton_cdiv(n, bs) for n in lens]
        width = max(nb)
        perm = torch.randperm(num_blocks, device=bench.device, generator=bench.gen)
        table = torch.zeros(batch, width, dtype=torch.int32, device=bench.device)
        used = 0
        for i, n in enumerate(nb):  # shuffled pages, like a long-running cache
            table[i, :n] = perm[used : used + n]
            used += n
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=bench.device)
        return table, seq_lens

    for batch, lens, label in cases:
        max_len = max(lens)
        splits = bench.dec.choose_num_splits(batch, Hkv, max_len, bench.dec.num_sms(bench.device))
        case = Case(
            "paged_decode_attention",
            {"shape": label, "splits": splits, "H": H, "Hkv": Hkv, "D": D, "bs": bs,
             "show": ["shape", "splits"],
             "dtype": str(bench.dtype)},
        )  # fmt: skip

        def body(case: Case, batch=batch, lens=lens, max_len=max_len) -> None:
            table, seq_lens = make(batch, lens)
            q = bench.randn(batch, H, D)
            out = torch.empty_like(q)
            kw = {"max_seq_len": max_len, "out": out}

            def run() -> None:
                bench.dec.paged_decode_attention(q, k_cache, v_cache, table, seq_lens, scale, **kw)

            run()
            rows = min(batch, check_rows)
            ref = bench.dec.paged_decode_attention_ref(
                q[:rows], k_cache, v_cache, table[:rows], seq_lens[:rows], scale
            )
            case.check = rel_error(out[:rows], ref, bench.dtype)
            case.work = sum(lens) * bytes_per_token + 2 * q.numel() * elt + table.numel() * 4
            case.peak = bench.copy_gbps
            case.triton_ms = bench.time_ms(run)
            if sum(lens) <= ref_token_limit:
                ref_out = torch.empty_like(q)
                case.torch_impl = "paged_decode_attention_ref"
                case.torch_ms = bench.time_ms(
                    lambda: bench.dec.paged_decode_attention_ref(
                        q, k_cache, v_cache, table, seq_lens, scale, out=ref_out
                    )
                )
            else:
                case.note = "torch ref not timed (gathers the whole context in fp32)"

        bench.run_case(case, body)


# decode split counts with a straggler
def bench_decode_splits(bench: Bench) -> None:
    """One long row among short ones: every row is cut into the same number of splits, so
    the long row's ranges set the step unless the count is high enough (the choice of
    balanced_num_splits, marked `balanced`, against fixed counts)."""
    if bench.smoke:
        H, Hkv, D, bs, batch, short, long = 4, 2, 64, 16, 6, 40, 300
    else:
        H, Hkv, D, bs, batch, short, long = 32, 8, 128, 16, 96, 2400, 30000
    print(f"-- decode splits: B={batch}, rows of {short} keys with and without one of {long}")
    scale = D**-0.5
    elt = torch.empty((), dtype=bench.dtype).element_size()
    for lens, label in (([short] * batch, "even"), ([short] * (batch - 1) + [long], "long")):
        nb = [triton_cdiv(n, bs) for n in lens]
        num_blocks = sum(nb)
        k_cache = bench.randn(num_blocks, bs, Hkv, D)
        v_cache = bench.randn(num_blocks, bs, Hkv, D)
        table = torch.zeros(batch, max(nb), dtype=torch.int32, device=bench.device)
        perm = torch.randperm(num_blocks, device=bench.device, generator=bench.gen)
        used = 0
        for i, n in enumerate(nb):
            table[i, :n] = perm[used : used + n].to(torch.int32)
            used += n
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=bench.device)
        balanced = bench.dec.balanced_num_splits(lens, Hkv, bench.dec.num_sms(bench.device))
        for splits in sorted({1, 2, 4, 8, 16, 32, balanced}):
            case = Case(
                "paged_decode_attention",
                {"shape": f"B={batch} {label}", "splits": splits,
                 "balanced": splits == balanced, "H": H, "Hkv": Hkv, "D": D, "bs": bs,
                 "show": ["shape", "splits", "balanced"], "dtype": str(bench.dtype)},
            )  # fmt: skip

            def body(
                case: Case, splits=splits, lens=lens, kv=(k_cache, v_cache, table, seq_lens)
            ) -> None:
                k_cache, v_cache, table, seq_lens = kv
                q = bench.randn(batch, H, D)
                out = torch.empty_like(q)

                def run() -> None:
                    bench.dec.paged_decode_attention(
                        q, k_cache, v_cache, table, seq_lens, scale,
                        max_seq_len=max(lens), num_splits=splits, out=out,
                    )  # fmt: skip

                run()
                rows = min(batch, 4)
                ref = bench.dec.paged_decode_attention_ref(
                    q[-rows:], k_cache, v_cache, table[-rows:], seq_lens[-rows:], scale
                )
                case.check = rel_error(out[-rows:], ref, bench.dtype)
                case.work = sum(lens) * 2 * Hkv * D * elt
                case.peak = bench.copy_gbps
                case.triton_ms = bench.time_ms(run)

            bench.run_case(case, body)
