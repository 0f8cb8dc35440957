# Launch choices of the paged decode kernel over an e4m3 (FP8) KV cache, beside the 16-bit cache
# at the same shapes. An e4m3 tile carries half the bytes of a bf16 one for the same per-key work
# (the q·k dot over a group padded to 16 rows, exp2, p·v), so the tile that keeps a bf16 cache at
# the copy ceiling can leave an e4m3 one latency-bound: on the H200 the default (64 keys, 4 warps,
# 3 stages) read an e4m3 cache at 1.6 TB/s against 4.1 TB/s for bf16 (kernels_fp8_h200.json).
# The first of TILES is that 16-bit tile; the shipped e4m3 choice is pda.FP8_LAUNCH.
# Every variant is checked against the torch reference first; one table, fastest per shape, JSON.
#   python -m benchmarks.sweeps.decode_fp8_sweep --json out.json
# Without a GPU (TRITON_INTERPRET=1) it runs two tiny shapes and a few tiles, timing one call by
# the wall clock: a check of the script, not a measurement.
from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import torch

from kernels import paged_decode_attention as pda

H, HKV, D, BS = 32, 8, 128, 16  # Llama-3.1-8B attention, block 16
SHAPES = [(64, 4096), (128, 2048), (256, 1024), (16, 16384)]
TILES = [(64, 4, 3), (128, 4, 3), (128, 8, 3), (64, 8, 3), (128, 4, 2), (64, 4, 4), (32, 4, 4),
         (128, 8, 2), (256, 8, 2)]  # fmt: skip
SPLIT_FACTORS = [1, 2]


def copy_gbps(device) -> float:
    if device.type != "cuda":
        return float("nan")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    import triton

    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() / ms / 1e6


def check_and_time(q, kc, vc, table, seq_lens, ctx, splits, scales) -> tuple[float, float]:
    """(median ms, rel L2 error of the first 8 rows against the reference); raises if wrong."""
    import triton

    out = torch.full_like(q, float("nan"))

    def run():
        pda.paged_decode_attention(q, kc, vc, table, seq_lens, D**-0.5, max_seq_len=ctx,
                                   num_splits=splits, out=out, **scales)  # fmt: skip

    run()
    ref = pda.paged_decode_attention_ref(q[:8], kc, vc, table[:8], seq_lens[:8], D**-0.5, **scales)
    err = ((out[:8].float() - ref.float()).norm() / ref.float().norm()).item()
    if not err < 2e-2:
        raise AssertionError(f"rel_l2 {err:.2e}")
    if q.device.type != "cuda":
        t0 = time.perf_counter()
        run()
        return 1e3 * (time.perf_counter() - t0), err
    return triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median"), err


def main(argv: list[str] | None = None) -> int:
    import triton

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", type=Path)
    p.add_argument("--heads", type=int, default=H, help="query heads (70B: 64)")
    p.add_argument("--kv-heads", type=int, default=HKV)
    p.add_argument("--shapes", help="batch:ctx,... (default: SHAPES)")
    p.add_argument("--widen", default="fp16,q", help="FP8_WIDEN choices to time (e4m3 tiles)")
    args = p.parse_args(argv)
    heads, kv_heads = args.heads, args.kv_heads
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shapes, tiles = (SHAPES, TILES) if cuda else ([(2, 100), (3, 40)], TILES[:2])
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    dots = args.widen.split(",")
    gen = torch.Generator(device=device).manual_seed(0)
    peak = copy_gbps(device)
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, copy {peak:.0f} GB/s")
    rows: list[dict] = []
    # (batch, ctx, cache, tile, split factor) -> ms, for the summary
    timed: dict[tuple, float] = {}
    shipped, shipped_dot = pda.FP8_LAUNCH, pda.FP8_WIDEN
    for batch, ctx in shapes:
        nb = triton.cdiv(ctx, BS)
        perm = torch.randperm(batch * nb, device=device, generator=gen)
        table = perm.view(batch, nb).to(torch.int32)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        q = torch.randn(batch, heads, D, device=device, dtype=torch.bfloat16, generator=gen)
        k16 = torch.randn(
            batch * nb, BS, kv_heads, D, device=device, dtype=torch.bfloat16, generator=gen
        )
        v16 = torch.randn_like(k16)
        k8, v8 = k16.to(torch.float8_e4m3fn), v16.to(torch.float8_e4m3fn)
        auto = pda.choose_num_splits(batch, kv_heads, ctx, pda.num_sms(device))
        variants = [("bf16", None, 1)]
        variants += [
            (f"e4m3-{dot}", t, f)
            for dot in dots
            for t, f in itertools.product(tiles, SPLIT_FACTORS)
        ]
        for cache, tile, factor in variants:
            splits = auto * factor
            kc, vc = (k16, v16) if cache == "bf16" else (k8, v8)
            scales = {} if cache == "bf16" else {"k_scale": 0.5, "v_scale": 2.0}
            pda.FP8_LAUNCH = tile
            pda.FP8_WIDEN = cache.removeprefix("e4m3-")
            row = {"batch": batch, "ctx": ctx, "cache": cache, "tile": tile, "splits": splits}
            try:
                ms, err = check_and_time(q, kc, vc, table, seq_lens, ctx, splits, scales)
            except Exception as e:  # a tile that does not compile or fit: recorded, not fatal
                row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
                rows.append(row)
                print(f"B={batch} ctx={ctx} {cache} {tile} splits={splits}: {row['error']}")
                continue
            elt = 2 if cache == "bf16" else 1
            gbps = batch * ctx * 2 * kv_heads * D * elt / ms / 1e6
            row.update(ms=ms, gbps=gbps, of_copy=gbps / peak, rel_l2=err)
            rows.append(row)
            timed[batch, ctx, cache, tile, factor] = ms
            print(f"B={batch:3d} ctx={ctx:5d} {cache} tile={tile} splits={splits:2d}: "
                  f"{ms:.4f} ms {gbps:7.0f} GB/s {100 * gbps / peak:4.0f} %")  # fmt: skip
    pda.FP8_LAUNCH, pda.FP8_WIDEN = shipped, shipped_dot
    print("\nfastest e4m3 per shape (against bf16, and e4m3 at the 16-bit tile):")
    for batch, ctx in shapes:
        for dot in dots:
            e4m3 = {(t, f): ms for (b, c, cache, t, f), ms in timed.items()
                    if (b, c, cache) == (batch, ctx, f"e4m3-{dot}")}  # fmt: skip
            if not e4m3:
                continue
            (tile, factor), best = min(e4m3.items(), key=lambda item: item[1])
            bf16 = timed.get((batch, ctx, "bf16", None, 1), math.nan)
            print(f"B={batch} ctx={ctx} widen {dot}: bf16 cache {bf16:.4f} ms; e4m3 at 16-bit "
                  f"tile {e4m3.get((tiles[0], 1), math.nan):.4f} ms; best {tile} at {factor}x "
                  f"the automatic splits {best:.4f} ms")  # fmt: skip

    # One tile for every shape (the engine captures one): the smallest geometric mean over the
    # shapes at the automatic split count; a tile that failed on any shape is out.
    def geomean(tile, dot) -> float:
        times = [timed.get((b, c, f"e4m3-{dot}", tile, 1), math.inf) for b, c in shapes]
        return math.prod(times) ** (1 / len(times))

    best_dot, best_tile = min(
        ((d, t) for d in dots for t in tiles), key=lambda dt: geomean(dt[1], dt[0])
    )
    print(f"best over all shapes: widen {best_dot}, tile {best_tile} (geomean "
          f"{geomean(best_tile, best_dot):.4f} ms)")  # fmt: skip
    result = {"copy_gbps": peak, "best_tile": best_tile, "best_widen": best_dot,
              "heads": heads, "kv_heads": kv_heads, "rows": rows}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
