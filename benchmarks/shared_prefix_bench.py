# Shared-prefix decode attention against plain paged decode attention, at the 70B's heads
# (64 query / 8 KV heads, head_dim 128, block 16), bf16 and e4m3 caches. Rows of ~2,000 keys
# (uniform in [0.8, 1.2] x --context) whose first --prefix keys are one of --groups shared
# prompts (the prefix cache's physical blocks: the same block ids in each row's table), the
# rest their own. Per batch and cache dtype:
#   plain   paged_decode_attention, the engine's split count (balanced_num_splits) and order
#   shared  shared_prefix_decode_attention over find_prefix_groups' groups, per max_rows
#           (rows per group: the prefix kernel's M side is max_rows x 8) and prefix_splits
#           (* marks the engine's own choice; the engine groups up to 16 rows)
# Each a CUDA-graph replay after an L2 flush (prefill_cases.graph_time_ms); "effective TB/s" is
# the keys' bytes as plain reads them (each row's whole context) over the time. The outputs are
# checked against plain's. The grouping's host time is printed too.
#   python -m benchmarks.shared_prefix_bench --json benchmarks/results/shared_prefix_h200.json
#   TRITON_INTERPRET=1 python -m benchmarks.shared_prefix_bench --smoke   (CPU, tiny shapes)
from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from benchmarks.sweeps.prefill_cases import graph_time_ms
from engine.core.prefix_groups import find_prefix_groups
from kernels import paged_decode_attention as pda
from kernels.shared_prefix_decode import PrefixGroups, shared_prefix_decode_attention

BLOCK = 16


def make_case(batch, context, prefix, groups, shared_rows, heads, cache_dtype, device, seed):
    """q, caches, block tables (the grouped rows' first prefix // BLOCK ids are their prompt's),
    seq_lens (host list and device tensor)."""
    num_heads, num_kv_heads, head_dim = heads
    rng = random.Random(seed)
    lens = [rng.randint(int(0.8 * context), int(1.2 * context)) for _ in range(batch)]
    prefix_blocks = prefix // BLOCK
    next_id = groups * prefix_blocks  # ids [0, next_id) are the prompts' blocks
    tables = []
    for n in lens:
        own_from = 0
        row = []
        if rng.random() < shared_rows and n > prefix + 1:
            p = rng.randrange(groups)
            row = list(range(p * prefix_blocks, (p + 1) * prefix_blocks))
            own_from = prefix_blocks
        need = -(-n // BLOCK) - own_from
        row += list(range(next_id, next_id + need))
        next_id += need
        tables.append(row)
    width = max(len(r) for r in tables) + 1
    table = torch.zeros((batch, width), dtype=torch.int32)
    perm = torch.randperm(next_id, generator=torch.Generator().manual_seed(seed))
    for i, r in enumerate(tables):
        table[i, : len(r)] = perm[torch.tensor(r)].to(torch.int32)  # scattered physical blocks
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (next_id, BLOCK, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16)
    q = torch.randn((batch, num_heads, head_dim), generator=g, device=device, dtype=torch.bfloat16)
    if cache_dtype != torch.bfloat16:
        k, v = k.to(cache_dtype), v.to(cache_dtype)
    return q, k, v, table.to(device), lens, torch.tensor(lens, dtype=torch.int32, device=device)


def measure(args, batch, cache_dtype, heads, device) -> dict:
    _, num_kv_heads, head_dim = heads
    q, k, v, table, lens, seq_lens = make_case(
        batch, args.context, args.prefix, args.groups, args.shared_rows, heads, cache_dtype,
        device, seed=batch,
    )  # fmt: skip
    scale = head_dim**-0.5
    sms = 132 if device.type == "cuda" else 1
    splits = pda.balanced_num_splits(lens, num_kv_heads, sms)
    order = torch.argsort(seq_lens, descending=True, stable=True).to(torch.int32)
    plain_out = torch.empty_like(q)

    def plain():
        pda.paged_decode_attention(
            q, k, v, table, seq_lens, scale, max_seq_len=max(lens), num_splits=splits,
            out=plain_out, seq_order=order,
        )  # fmt: skip

    elem = k.element_size()
    kv_bytes = sum(lens) * num_kv_heads * head_dim * 2 * elem
    plain_ms = graph_time_ms(plain)
    name = "e4m3" if cache_dtype == torch.float8_e4m3fn else "bf16"
    row = {"batch": batch, "cache": name, "plain_ms": plain_ms, "plain_splits": splits,
           "kv_bytes": kv_bytes, "shared": []}  # fmt: skip
    print(f"B={batch:4d} {name}  plain {plain_ms:.4f} ms  {kv_bytes / plain_ms / 1e9:.2f} TB/s "
          f"effective  splits {splits}", flush=True)  # fmt: skip
    host_tables = table.cpu().numpy()
    host_lens = seq_lens.cpu().numpy()
    for max_rows in args.max_rows:
        kw = {"min_blocks": args.min_blocks, "max_blocks": 4096 // BLOCK,
              "max_groups": args.max_groups, "max_rows": max_rows}  # fmt: skip
        group_us = float("inf")  # host time: the best of a few calls (the first warms up)
        for _ in range(5):
            t0 = time.perf_counter()
            found = find_prefix_groups(host_tables, host_lens, BLOCK, **kw).trimmed()
            group_us = min(group_us, (time.perf_counter() - t0) * 1e6)
        groups = PrefixGroups.from_host(found.rows, found.prefix_lens, found.key_start, device)
        suffix = [n - int(s) for n, s in zip(lens, found.key_start)]
        suffix_splits = pda.balanced_num_splits(suffix, num_kv_heads, sms)
        read = kv_bytes - found.shared_keys_saved * num_kv_heads * head_dim * 2 * elem
        # the batch builder's choice (BatchBuilder._prefix_splits) is always among those timed
        longest = int(found.prefix_lens.max()) if found.num_groups else 0
        auto = pda.choose_num_splits(found.num_groups, num_kv_heads, longest, sms)
        for prefix_splits in sorted({*args.prefix_splits, auto}):
            out = torch.empty_like(q)

            def shared(groups=groups, out=out, s=suffix_splits, p=prefix_splits):
                shared_prefix_decode_attention(
                    q, k, v, table, seq_lens, scale, groups, max_seq_len=max(lens),
                    num_splits=s, prefix_splits=p, out=out, seq_order=order,
                )  # fmt: skip

            ms = graph_time_ms(shared)
            err = ((out.float() - plain_out.float()).norm() / plain_out.float().norm()).item()
            entry = {"max_rows": max_rows, "prefix_splits": prefix_splits,
                     "engine_choice": prefix_splits == auto,
                     "suffix_splits": suffix_splits, "ms": ms, "rel_l2_vs_plain": err,
                     "grouped_rows": found.num_grouped_rows, "bytes_read": read,
                     "grouping_us": group_us, "speedup": plain_ms / ms}  # fmt: skip
            row["shared"].append(entry)
            mark = "*" if prefix_splits == auto else " "
            print(f"   shared rows/group {max_rows:2d} prefix splits {prefix_splits}{mark} suffix "
                  f"splits {suffix_splits:2d}: {ms:.4f} ms  {kv_bytes / ms / 1e9:.2f} TB/s "
                  f"effective ({read / ms / 1e9:.2f} read)  x{plain_ms / ms:.2f}  "
                  f"{found.num_grouped_rows}/{batch} rows grouped, KV read "
                  f"-{100 * (1 - read / kv_bytes):.0f} %, grouping {group_us:.0f} us host, "
                  f"rel_l2 {err:.1e}", flush=True)  # fmt: skip
            if err > 2e-2:
                raise AssertionError(f"B={batch} {name}: shared differs from plain ({err:.2e})")
    best = min(row["shared"], key=lambda e: e["ms"])
    row["best"] = best
    print(f"   best: rows/group {best['max_rows']} prefix splits {best['prefix_splits']} "
          f"x{best['speedup']:.2f}", flush=True)  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter too)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--prefix", type=int, default=1200, help="shared keys (whole blocks)")
    ap.add_argument("--groups", type=int, default=8, help="distinct shared prompts")
    ap.add_argument("--shared-rows", type=float, default=1.0, help="share of rows with one")
    ap.add_argument("--max-rows", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--prefix-splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--min-blocks", type=int, default=16)
    ap.add_argument("--max-groups", type=int, default=32)
    ap.add_argument("--cache", nargs="+", default=["bf16", "e4m3"])
    args = ap.parse_args(argv)
    # Triton's interpreter runs on CPU tensors only (a GPU host running the smoke check too)
    cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
    device = torch.device("cuda" if cuda else "cpu")
    heads = (64, 8, 128)
    if args.smoke:
        heads = (8, 2, 32)
        args.batches, args.context, args.prefix, args.groups = [6], 64, 32, 2
        args.max_rows, args.prefix_splits, args.min_blocks = [4], [2], 1
    dtypes = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}
    t0 = time.perf_counter()
    rows = [measure(args, b, dtypes[c], heads, device) for c in args.cache for b in args.batches]
    print(f"done in {time.perf_counter() - t0:.1f}s")
    if args.json:
        name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        settings = {k: str(v) for k, v in vars(args).items()}
        meta = {"device": name, "heads": heads, "block": BLOCK, "args": settings}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
