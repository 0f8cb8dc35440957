# Launch choices of the paged decode kernel over an e4m3 (FP8) KV cache, beside the 16-bit cache
# at the same shapes. An e4m3 tile carries half the bytes of a bf16 one for the same per-key work
# (the q·k dot over a group padded to 16 rows, exp2, p·v), so the tile that keeps a bf16 cache at
# the copy ceiling can leave an e4m3 one latency-bound: on the H200 the default (64 keys, 4 warps,
# 3 stages) read an e4m3 cache at 1.6 TB/s against 4.1 TB/s for bf16 (kernels_fp8_h200.json).
# The first of TILES is that 16-bit tile; the shipped e4m3 choice is pda.FP8_LAUNCH.
# Every variant is checked against the torch reference first; one table, fastest per shape, JSON.
#   python -m benchmarks.sweeps.decode_fp8_sweep --json out.json
# --walks keys,blocks,blocks_t,blocks_ts times each walk of a key range (kernels/
# paged_decode_walks.py) for both caches and prints the walk table: ms per layer against the
# bytes-over-copy-rate floor, and each walk's speedup over the bf16 "keys" kernel with its geomean
# over the shapes (a walk becomes pda.FP8_WALK at >= FLIP_GEOMEAN with every shape faster, its
# GPU tests passing):
#   python -m benchmarks.sweeps.decode_fp8_sweep --heads 64 --kv-heads 8 \
#     --walks keys,blocks,blocks_t,blocks_ts --tiles shipped --factors 1 \
#     --shapes 64:2048,128:2048,256:1024 --json out.json
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
FLIP_GEOMEAN = 1.15  # the e4m3 walk's geomean speedup over bf16 "keys" that flips FP8_WALK


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
    p.add_argument("--walks", default="keys", help="walks to time, e.g. keys,blocks,blocks_t")
    p.add_argument("--tiles", help="e4m3 tiles: 'shipped' (FP8_LAUNCH) and/or N:warps:stages,...")
    p.add_argument("--factors", default="1,2", help="e4m3 split counts, x the automatic one")
    args = p.parse_args(argv)
    heads, kv_heads = args.heads, args.kv_heads
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shapes, tiles = (SHAPES, TILES) if cuda else ([(2, 100), (3, 40)], TILES[:2])
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
    if args.tiles:
        tiles = [pda.FP8_LAUNCH if t == "shipped" else tuple(int(v) for v in t.split(":"))
                 for t in args.tiles.split(",")]  # fmt: skip
    dots = args.widen.split(",")
    walks = args.walks.split(",")
    factors = [int(f) for f in args.factors.split(",")]
    gen = torch.Generator(device=device).manual_seed(0)
    peak = copy_gbps(device)
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}, copy {peak:.0f} GB/s")
    rows: list[dict] = []
    # (batch, ctx, cache, tile, split factor, walk) -> ms, for the summaries
    timed: dict[tuple, float] = {}
    shipped = pda.FP8_LAUNCH, pda.FP8_WIDEN, pda.WALK, pda.FP8_WALK
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
        variants = [("bf16", None, 1, walk) for walk in walks]
        variants += [
            (f"e4m3-{dot}", t, f, walk)
            for walk in walks
            for dot in dots
            for t, f in itertools.product(tiles, factors)
        ]
        for cache, tile, factor, walk in variants:
            splits = auto * factor
            kc, vc = (k16, v16) if cache == "bf16" else (k8, v8)
            scales = {} if cache == "bf16" else {"k_scale": 0.5, "v_scale": 2.0}
            pda.FP8_LAUNCH = tile
            pda.FP8_WIDEN = cache.removeprefix("e4m3-")
            pda.WALK = pda.FP8_WALK = walk
            row = {"batch": batch, "ctx": ctx, "cache": cache, "tile": tile, "splits": splits,
                   "walk": walk}  # fmt: skip
            try:
                ms, err = check_and_time(q, kc, vc, table, seq_lens, ctx, splits, scales)
            except Exception as e:  # a tile that does not compile or fit: recorded, not fatal
                row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
                rows.append(row)
                print(f"B={batch} ctx={ctx} {cache} {walk} {tile} splits={splits}: "
                      f"{row['error']}")  # fmt: skip
                continue
            elt = 2 if cache == "bf16" else 1
            kv_bytes = batch * ctx * 2 * kv_heads * D * elt
            gbps = kv_bytes / ms / 1e6
            floor_ms = kv_bytes / peak / 1e6  # the K/V bytes at the copy rate
            row.update(ms=ms, gbps=gbps, of_copy=gbps / peak, floor_ms=floor_ms, rel_l2=err)
            rows.append(row)
            timed[batch, ctx, cache, tile, factor, walk] = ms
            print(f"B={batch:3d} ctx={ctx:5d} {cache} {walk} tile={tile} splits={splits:2d}: "
                  f"{ms:.4f} ms {gbps:7.0f} GB/s {100 * gbps / peak:4.0f} %")  # fmt: skip
    pda.FP8_LAUNCH, pda.FP8_WIDEN, pda.WALK, pda.FP8_WALK = shipped
    print("\nfastest e4m3 per shape (against bf16, and e4m3 at the 16-bit tile):")
    walk0 = walks[0]
    for batch, ctx in shapes:
        for dot in dots:
            e4m3 = {(t, f): ms for (b, c, cache, t, f, w), ms in timed.items()
                    if (b, c, cache, w) == (batch, ctx, f"e4m3-{dot}", walk0)}  # fmt: skip
            if not e4m3:
                continue
            (tile, factor), best = min(e4m3.items(), key=lambda item: item[1])
            bf16 = timed.get((batch, ctx, "bf16", None, 1, walk0), math.nan)
            print(f"B={batch} ctx={ctx} widen {dot}: bf16 cache {bf16:.4f} ms; e4m3 at 16-bit "
                  f"tile {e4m3.get((tiles[0], 1), math.nan):.4f} ms; best {tile} at {factor}x "
                  f"the automatic splits {best:.4f} ms")  # fmt: skip

    # One tile for every shape (the engine captures one): the smallest geometric mean over the
    # shapes at the automatic split count; a tile that failed on any shape is out.
    def geomean(tile, dot, walk=walk0) -> float:
        times = [timed.get((b, c, f"e4m3-{dot}", tile, 1, walk), math.inf) for b, c in shapes]
        return math.prod(times) ** (1 / len(times))

    best_dot, best_tile = min(
        ((d, t) for d in dots for t in tiles), key=lambda dt: geomean(dt[1], dt[0])
    )
    print(f"best over all shapes ({walk0}): widen {best_dot}, tile {best_tile} (geomean "
          f"{geomean(best_tile, best_dot):.4f} ms)")  # fmt: skip
    result = {"copy_gbps": peak, "best_tile": best_tile, "best_widen": best_dot,
              "heads": heads, "kv_heads": kv_heads, "rows": rows}  # fmt: skip
    if walks != ["keys"]:
        result["walks"] = walk_table(timed, shapes, walks, dots, tiles, peak, kv_heads)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def walk_table(timed, shapes, walks, dots, tiles, peak, kv_heads) -> list[dict]:
    """Each (cache, walk, widening, tile) at the automatic split count: ms per layer per shape,
    the speedup over the bf16 "keys" kernel, its geomean, and the K/V bytes' floor; a line per
    e4m3 walk that meets the rule for FP8_WALK. -> one dict per line."""
    base = {(b, c): timed.get((b, c, "bf16", None, 1, "keys"), math.nan) for b, c in shapes}
    lines = [("bf16", w, "-", None) for w in walks]
    lines += [(f"e4m3-{d}", w, d, t) for w in walks for d in dots for t in tiles]
    head = "".join(f"{f'B={b} ctx={c}':>22}" for b, c in shapes)
    print(f"\nwalks at the automatic splits: ms per layer (x: bf16 keys ms / this)\n"
          f"{'cache':11} {'walk':9} {'tile':13}{head}  geomean x  every shape faster")  # fmt: skip
    floors = {}
    for elt, name in ((2, "bf16"), (1, "e4m3")):
        floors[name] = [b * c * 2 * kv_heads * D * elt / peak / 1e6 for b, c in shapes]
        cells = "".join(f"{ms:22.4f}" for ms in floors[name])
        print(f"{name + ' floor':11} {'(copy rate)':9} {'':13}{cells}")
    out = []
    for cache, walk, _dot, tile in lines:
        ms = [timed.get((b, c, cache, tile, 1, walk), math.nan) for b, c in shapes]
        speed = [base[s] / m for s, m in zip(shapes, ms)]
        gm = math.prod(speed) ** (1 / len(speed)) if all(x > 0 for x in speed) else math.nan
        faster = all(x > 1 for x in speed)
        cells = "".join(f"{m:14.4f} ({x:4.2f}x)" for m, x in zip(ms, speed))
        print(f"{cache:11} {walk:9} {tile!s:13}{cells}  {gm:9.3f}  {faster}")
        floor = floors["bf16" if cache == "bf16" else "e4m3"]
        out.append({"cache": cache, "walk": walk, "tile": tile, "ms": ms, "speedup": speed,
                    "geomean": gm, "every_shape_faster": faster,
                    "of_floor": [f / m for f, m in zip(floor, ms)]})  # fmt: skip
    for line in out:
        flips = line["geomean"] >= FLIP_GEOMEAN and line["every_shape_faster"]
        if line["cache"] != "bf16" and flips:
            print(f"meets the FP8_WALK rule: {line['walk']} ({line['cache']}, tile "
                  f"{line['tile']}), geomean {line['geomean']:.3f}x the bf16 keys kernel, every "
                  f"shape faster")  # fmt: skip
    return out


if __name__ == "__main__":
    raise SystemExit(main())
