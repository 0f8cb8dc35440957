# The bf16 decode kernel's tile (keys per tile, warps, pipeline stages) at the shapes a serving
# engine meets: nano's short rows at batch 32-256, seed-like rows, long contexts. The default
# (BLOCK_N_DEFAULT, NUM_WARPS, NUM_STAGES in kernels/paged_decode_attention.py) was set before
# the split rule and never swept for 16-bit caches (decode_fp8_sweep.py swept e4m3 tiles). Each
# case is a CUDA-graph replay after an L2 flush, at the split count the engine picks, checked
# against the torch reference (decode_split_sweep.timed).
#   python -m benchmarks.sweeps.decode_tile_sweep --json out.json [--best-to FILE]
# --best-to writes the tile with the lowest summed time over the nano shapes as "n w s" (for a
# job that then runs the engine with it).
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from benchmarks.sweeps.decode_split_sweep import HKV, make_inputs, timed
from kernels import paged_decode_attention as pda

TILES = [(64, 4, 3), (64, 4, 4), (64, 4, 2), (128, 4, 3), (128, 4, 2), (128, 8, 3), (32, 4, 4),
         (64, 8, 3), (32, 4, 6)]  # fmt: skip


def shapes() -> list[tuple[str, list[int], bool]]:
    """(label, row lengths, counts towards nano's sum)"""
    rng = random.Random(0)
    out = [(f"nano B={b}", [rng.randint(350, 1050) for _ in range(b)], True)
           for b in (32, 64, 128, 192, 256)]  # fmt: skip
    out.append(("seed-like B=136", [rng.randint(1200, 3600) for _ in range(136)], False))
    out.append(("B=64 U[2000,6000]", [rng.randint(2000, 6000) for _ in range(64)], False))
    out.append(("B=16 U[8000,24000]", [rng.randint(8000, 24000) for _ in range(16)], False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--best-to")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    default = (pda.BLOCK_N_DEFAULT, pda.NUM_WARPS, pda.NUM_STAGES)
    rows, nano_sum = [], dict.fromkeys(TILES, 0.0)
    for label, lens, nano in shapes():
        inputs = make_inputs(lens, torch.bfloat16, torch.device("cuda"), gen)
        ladder = pda.split_ladder(len(lens), HKV, 8192)
        splits = pda.balanced_num_splits(lens, HKV, candidates=ladder)
        times = {}
        for tile in TILES:
            pda.BLOCK_N_DEFAULT, pda.NUM_WARPS, pda.NUM_STAGES = tile
            try:
                times[tile] = timed(inputs, lens, splits, check=True)
            except Exception as e:  # a tile that does not compile or fits no smem is a result
                print(f"  {tile}: {type(e).__name__}: {str(e)[:120]}")
        pda.BLOCK_N_DEFAULT, pda.NUM_WARPS, pda.NUM_STAGES = default
        del inputs
        if nano:
            for t in TILES:
                nano_sum[t] += times.get(t, float("inf"))
        best = min(times, key=times.get)
        rows.append({"shape": label, "splits": splits,
                     "times_ms": {"x".join(map(str, t)): ms for t, ms in times.items()},
                     "best": "x".join(map(str, best))})  # fmt: skip
        print(f"{label:20s} s{splits:<2d} default {times[default] * 1e3:7.1f} us  best "
              f"{best} {times[best] * 1e3:7.1f} us ({times[best] / times[default] - 1:+.1%})  "
              + " ".join(f"{t[0]}/{t[1]}/{t[2]}:{ms * 1e3:.1f}" for t, ms in times.items()),
              flush=True)  # fmt: skip
    best_nano = min(nano_sum, key=nano_sum.get)
    print(f"nano shapes summed: default {nano_sum[default] * 1e3:.1f} us, best {best_nano} "
          f"{nano_sum[best_nano] * 1e3:.1f} us", flush=True)  # fmt: skip
    if args.best_to:
        Path(args.best_to).write_text(" ".join(map(str, best_nano)))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "nano_sum_ms": {
            "x".join(map(str, t)): v for t, v in nano_sum.items()}}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
