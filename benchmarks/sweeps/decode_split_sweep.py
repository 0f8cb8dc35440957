# How many splits should a decode step cut each row into? The paged decode kernel at the batch
# sizes and length spreads a serving engine meets (nano: contexts uniform in [c/2, 3c/2]; one
# long document among chat rows), every split count, the reduce kernel with one head or one
# GQA group per program. Each timing is the median of CUDA-event intervals around a CUDA-graph
# replay of the launcher's kernels (as the engine runs them: no host launch time; a direct call
# of a short case measures Python) after an L2 flush (prefill_cases.time_ms), the rows launched
# longest first as the engine launches them; every variant is
# checked against the torch reference first. What balanced_num_splits picks over the counts the
# engine captures is shown beside the best, and what the rule before it (longest / mean, counts
# x1/x4/x16) picked.
#   python -m benchmarks.sweeps.decode_split_sweep --json out.json
# Without a GPU (TRITON_INTERPRET=1) it runs two tiny shapes: a check of the script only.
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from benchmarks.sweeps.prefill_cases import graph_time_ms
from kernels import paged_decode_attention as pda

H, HKV, D, BS = 32, 8, 128, 16  # Llama-3.1-8B attention, block 16
SPLITS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
BATCHES = (1, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
CONTEXTS = (400, 700, 1500, 3000, 8000)  # mean row; rows uniform in [c/2, 3c/2]


def shapes(smoke: bool, batches=BATCHES, contexts=CONTEXTS) -> list[tuple[str, list[int]]]:
    rng = random.Random(0)
    if smoke:
        return [
            ("B=4 U[20,60]", [rng.randint(20, 60) for _ in range(4)]),
            ("B=3 long", [40, 40, 300]),
        ]
    out = []
    for c in contexts:
        for b in batches:
            out.append(
                (
                    f"B={b} U[{c // 2},{3 * c // 2}]",
                    [rng.randint(c // 2, 3 * c // 2) for _ in range(b)],
                )
            )
    out.append(("B=136 seed-like", [rng.randint(1200, 3600) for _ in range(136)]))
    out.append(("B=96 2400 + one 30000", [2400] * 95 + [30000]))
    out.append(("B=96 2400 even", [2400] * 96))
    return out


def make_inputs(lens: list[int], dtype, device, gen):
    nb = [-(-n // BS) for n in lens]
    num_blocks = sum(nb)
    k_cache = torch.randn(num_blocks, BS, HKV, D, device=device, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, BS, HKV, D, device=device, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    table = torch.zeros(len(lens), max(nb), dtype=torch.int32, device=device)
    used = 0
    for i, n in enumerate(nb):  # shuffled pages, like a long-running cache
        table[i, :n] = perm[used : used + n]
        used += n
    q = torch.randn(len(lens), H, D, device=device, generator=gen).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, table, seq_lens


def timed(inputs, lens, splits: int, check: bool) -> float:
    q, kc, vc, table, seq_lens = inputs
    out = torch.full_like(q, float("nan"))
    # as the engine launches them: rows longest context first (AttentionMetadata.decode_order)
    order = torch.argsort(seq_lens, descending=True, stable=True).to(torch.int32)

    def run():
        pda.paged_decode_attention(
            q, kc, vc, table, seq_lens, D**-0.5, max_seq_len=max(lens), num_splits=splits,
            out=out, seq_order=order,
        )  # fmt: skip

    run()
    if check:
        rows = min(8, len(lens))
        ref = pda.paged_decode_attention_ref(
            q[:rows], kc, vc, table[:rows], seq_lens[:rows], D**-0.5
        )
        err = ((out[:rows].float() - ref.float()).norm() / ref.float().norm()).item()
        if not err < 2e-2 or out.isnan().any():
            raise AssertionError(f"splits {splits}: rel_l2 {err:.2e} or unwritten rows")
    return graph_time_ms(run)


def old_pick(lens: list[int]) -> int:
    """The rule before: max(even-lengths choice, longest / mean row), over counts x1/x4/x16 of
    the even-lengths choice at 8,192 keys (the engine's capture)."""
    n, longest = len(lens), max(lens)
    typical = max(pda.MIN_KEYS_PER_SPLIT, sum(lens) // n)
    wanted = max(
        pda.choose_num_splits(n, HKV, longest), min(pda.MAX_SPLITS, -(-longest // typical))
    )
    base = pda.choose_num_splits(n, HKV, 8192)
    cap = max(base, -(-8192 // pda.MIN_KEYS_PER_SPLIT))
    ladder = sorted({min(base * f, pda.MAX_SPLITS, cap) for f in (1, 4, 16)})
    return next((c for c in ladder if c >= wanted), ladder[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--batches", default=None, help="comma-separated (default: all)")
    ap.add_argument("--contexts", default=None, help="comma-separated mean rows (default: all)")
    args = ap.parse_args()
    batches = tuple(map(int, args.batches.split(","))) if args.batches else BATCHES
    contexts = tuple(map(int, args.contexts.split(","))) if args.contexts else CONTEXTS
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    smoke = not cuda
    copy_bytes_s = None
    if cuda:
        from fleetlm.bench.roofline_check import measure_ceilings

        copy_bytes_s = measure_ceilings()["copy_bytes_s"]
    group = H // HKV
    rows = []
    for label, lens in shapes(smoke, batches, contexts):
        inputs = make_inputs(lens, dtype, device, gen)
        kv_bytes = sum(lens) * HKV * D * 2 * inputs[1].element_size()
        useful = max(1, -(-max(lens) // pda.MIN_KEYS_PER_SPLIT))
        ladder = pda.split_ladder(len(lens), HKV, 8192)
        picked = pda.balanced_num_splits(lens, HKV, 132, candidates=ladder)
        old = old_pick(lens)
        counts = [s for s in SPLITS if s <= useful] if not smoke else [1, 2, 3]
        counts = sorted({*counts, picked, old})
        times: dict[str, float] = {}
        for s in counts:
            # the reduce with one head per program too, at a few counts (the change's A/B)
            for block_h in [1, group] if s in (2, 4, 16) else [group]:
                pda.REDUCE_BLOCK_H = block_h
                times[f"s{s}/h{block_h}"] = timed(inputs, lens, s, check=block_h == group)
        pda.REDUCE_BLOCK_H = None
        del inputs
        best_key = min((k for k in times if k.endswith(f"/h{group}")), key=times.get)
        picked_ms, old_ms = times[f"s{picked}/h{group}"], times[f"s{old}/h{group}"]
        row = {
            "shape": label, "batch": len(lens), "mean_len": sum(lens) / len(lens),
            "max_len": max(lens), "kv_bytes": kv_bytes, "times_ms": times, "best": best_key,
            "best_ms": times[best_key], "ladder": ladder, "picked": picked,
            "picked_ms": picked_ms, "old_pick": old, "old_ms": old_ms,
        }  # fmt: skip
        if copy_bytes_s:
            row["best_of_copy"] = kv_bytes / (times[best_key] * 1e-3) / copy_bytes_s
        rows.append(row)
        print(f"{label:26s} best {best_key:8s} {times[best_key]:.4f} ms"
              + (f" ({100 * row['best_of_copy']:.0f} % of copy)" if copy_bytes_s else "")
              + f"; s1 {times[f's1/h{group}']:.4f}; new rule s{picked} {picked_ms:.4f}"
              + f"; old rule s{old} {old_ms:.4f}", flush=True)  # fmt: skip
    if rows:
        new_total = sum(r["picked_ms"] for r in rows)
        old_total = sum(r["old_ms"] for r in rows)
        best_total = sum(r["best_ms"] for r in rows)
        print(f"sum over shapes: best {best_total:.3f} ms, new rule {new_total:.3f}, "
              f"old rule {old_total:.3f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"copy_bytes_s": copy_bytes_s, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
