# Does the order in which the decode kernel's programs start matter? At nano's shapes (contexts
# uniform in [c/2, 3c/2]) the rows differ in length by 3x; when the last wave of programs holds
# long rows, the kernel ends on a tail of a few busy SMs. Per shape, each a CUDA-graph replay of
# the launcher's kernels after an L2 flush (prefill_cases.time_ms) at the engine's split count:
#   as_is          rows in batch order (seq_order None)
#   longest_first  seq_order = the rows by context, longest first (what the engine passes)
#   equal_lengths  every row at the mean length: the same keys with no imbalance (a bound)
#   base           with --base FILE: another version of kernels/paged_decode_attention.py
#                  (e.g. `git show <rev>:kernels/paged_decode_attention.py > /tmp/base.py`),
#                  rows in batch order
# Every variant's output is checked equal to as_is's (the order changes only the launch order).
#   python -m benchmarks.decode_order_bench [--base FILE] --json out.json
from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

import torch

from benchmarks.sweeps.decode_split_sweep import HKV, D, make_inputs
from benchmarks.sweeps.prefill_cases import graph_time_ms
from kernels import paged_decode_attention as pda


def shapes() -> list[tuple[str, list[int]]]:
    rng = random.Random(0)
    out = [
        (f"B={b} U[350,1050]", [rng.randint(350, 1050) for _ in range(b)])
        for b in (32, 64, 128, 192, 256)
    ]
    out.append(("B=256 U[100,1500]", [rng.randint(100, 1500) for _ in range(256)]))
    out.append(("B=136 seed-like", [rng.randint(1200, 3600) for _ in range(136)]))
    out.append(("B=96 2400 + one 30000", [2400] * 95 + [30000]))
    return out


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("base_decode_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(label: str, lens: list[int], base, gen) -> dict:
    splits = pda.balanced_num_splits(
        lens, HKV, 132, candidates=pda.split_ladder(len(lens), HKV, 8192)
    )
    q, kc, vc, table, seq_lens = make_inputs(lens, torch.bfloat16, "cuda", gen)
    longest_first = torch.argsort(seq_lens, descending=True, stable=True).to(torch.int32)
    variants = {"as_is": (pda, None), "longest_first": (pda, longest_first)}
    if base is not None:
        variants["base"] = (base, None)
    row: dict = {"shape": label, "batch": len(lens), "splits": splits}
    reference = None
    for name, (module, order) in variants.items():
        out = torch.empty_like(q)
        kw = {} if order is None else {"seq_order": order}

        def run(module=module, out=out, kw=kw):
            module.paged_decode_attention(
                q, kc, vc, table, seq_lens, D**-0.5, max_seq_len=max(lens), num_splits=splits,
                out=out, **kw,
            )  # fmt: skip

        row[name] = graph_time_ms(run)
        if reference is None:
            reference = out.clone()
        elif not torch.equal(out, reference):
            raise AssertionError(f"{label}: {name} differs from as_is")
    del q, kc, vc, table, seq_lens
    mean = sum(lens) // len(lens)
    q, kc, vc, table, seq_lens = make_inputs([mean] * len(lens), torch.bfloat16, "cuda", gen)
    out = torch.empty_like(q)
    row["equal_lengths"] = graph_time_ms(
        lambda: pda.paged_decode_attention(
            q, kc, vc, table, seq_lens, D**-0.5, max_seq_len=mean, num_splits=splits, out=out
        )
    )
    row["kv_bytes"] = sum(lens) * HKV * D * 2 * 2
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default=None, help="another paged_decode_attention.py to time")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (CUDA-graph replays of the decode kernel)")
    base = load_module(args.base) if args.base else None
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, lens in shapes():
        row = measure(label, lens, base, gen)
        rows.append(row)
        gain = 100 * (1 - row["longest_first"] / row["as_is"])
        print(f"{label:24s} splits {row['splits']:2d}  as is {row['as_is']:.4f} ms  longest "
              f"first {row['longest_first']:.4f} ({gain:+.1f} %)  equal lengths "
              f"{row['equal_lengths']:.4f}"
              + (f"  base {row['base']:.4f}" if "base" in row else ""), flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
