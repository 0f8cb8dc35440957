"""Where the warp-specialized dense prefill kernel (kernels/dense_prefill_ws.py) goes wrong on a
GPU. The H200 sweep of 2026-12-01 (benchmarks/results/prefill_sweep_h200_2026-12-01.log) found
every warp_spec variant without host descriptors returning NaN on 1 x 8192 causal (Llama-3.1-8B
heads, q/k/v views of one fused qkv buffer) while the CPU interpreter passes every test.

    PYTHONPATH=$PWD python3 -m benchmarks.sweeps.prefill_ws_diagnose --json OUT.json [--dump DIR]
    python3 -m benchmarks.sweeps.prefill_ws_diagnose --smoke   # CPU, TRITON_INTERPRET

Each case (1 x 8192, 1 x 256, 1 x 1000, 2 x 512 causal; then 2 x 384 after a 512-token cached
prefix, the only one the merge kernel works on) runs in a child process of its own under a
timeout: a hang or a crash is reported with the last step the child reached, and the next case
runs. Inputs are the sweep's (benchmarks/sweeps/prefill_cases.make_inputs, seed --seed).
Variants, in this order, on one config (--config, default 128/128/4/2, always warp_spec):
  plain     the default, non-warp-specialized kernel: checks the reference and the inputs
  ws-off    the chunk kernel compiled with warp_specialize=False: if it is right and ws is
            wrong, the warp specialization pass is to blame, not the kernel's arithmetic
  ws        the chunk kernel as the sweep runs it, then the prefix merge
  ws-again  the same call again: another NaN pattern (or other bits) means a race
  ws-sep    q/k/v as separate contiguous tensors: rules the fused views' strides in or out
Before each call `out` holds SENTINEL and the lse scratch LSE_SENTINEL, so a row never written
shows as "unwritten", not as NaN (the sweep pre-filled NaN). For each variant the chunk
kernel's output and log-sum-exp (before the merge) and the final output are classified by
(token, head) row: NaN, inf, unwritten, all zero, finite but wrong (> MAX_ABS), ok; for each
class the fraction, the first EXAMPLES rows (token, sequence, position, head, tile =
position // block_m, row in tile = position % block_m) and histograms by row in tile, by tile
and by head; and the max abs error by tile. The compiled chunk kernels are listed (warps,
registers, spills, whether the TTGIR holds a ttg.warp_specialize) and, with --dump, their TTGIR
and PTX written out. Needs only torch and triton (and this repository's kernels).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]

LOG2E = 1.4426950408889634
SENTINEL = 1000.0  # out before each call (exact in bf16/fp16; |attention output| <= max |v|)
LSE_SENTINEL = 12345.0  # the lse scratch before each call
MAX_ABS = 0.0625  # as benchmarks/sweeps/prefill_cases.py: bf16 outputs, fp32 reference
LSE_TOL = 1e-2
EXAMPLES = 20
CASES = [(1, 0, 8192), (1, 0, 256), (1, 0, 1000), (2, 0, 512), (2, 512, 384)]
DIMS = (32, 8, 128, 16)  # query heads, KV heads, head_dim, KV block size (Llama-3.1-8B)
CONFIG = "128/128/4/2"
# Every path of the script in two cases (a case is a child process, ~3 s of imports on CPU):
# two sequences of two tiles, the second partial, with nothing cached (the merge returns at
# once); then two of one partial tile each after a cached prefix (the merge's own work).
SMOKE_CASES = [(2, 0, 40), (2, 16, 24)]
SMOKE_DIMS = (4, 1, 64, 16)
SMOKE_CONFIG = "32/16/4/2"
VARIANTS = ("plain", "ws-off", "ws", "ws-again", "ws-sep")
BUDGET_S = 80.0  # every case; the job cuts the whole run at 90 s (the parent starts in ~5)
FIRST_TIMEOUT_S = 55.0  # the first case compiles the kernels (cold: ~10 s each)
CASE_TIMEOUT_S = 30.0


def log(msg: str) -> None:
    print(f"[prefill_ws_diagnose {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_config(text: str):
    """'128/128/4/2' or '128/128/4/2 tma' -> a warp_spec PrefillConfig."""
    from kernels.dense_prefill_attention import PrefillConfig

    words = text.split()
    block_m, block_n, warps, stages = (int(x) for x in words[0].split("/"))
    return PrefillConfig(block_m, block_n, warps, stages, tma="tma" in words[1:], warp_spec=True)


def case_label(case) -> str:
    n, prefix, q_len = case
    return f"{n}x{q_len}" + (f" +prefix {prefix}" if prefix else "")


# ---------------------------------------------------------------------------------------------
# Child: one case
# ---------------------------------------------------------------------------------------------
_T0 = time.monotonic()


def step(msg: str) -> None:
    """A progress line: the parent names the last one if the child hangs."""
    print(f"@step [{time.monotonic() - _T0:6.1f} s] {msg}", flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reference(q, k, v, k_cache, v_cache, table, seq_lens, qsl, scale) -> dict[str, torch.Tensor]:
    """fp32 attention: each chunk over its own keys (the chunk kernel's output and base-2
    log-sum-exp of the scaled scores) and over its cached prefix too (the final output)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k.shape[1], k_cache.shape[1]
    group = num_heads // num_kv_heads
    f32 = dict(dtype=torch.float32, device=q.device)
    chunk_out = torch.zeros(num_tokens, num_heads, head_dim, **f32)
    chunk_lse = torch.zeros(num_tokens, num_heads, **f32)
    final_out = torch.zeros(num_tokens, num_heads, head_dim, **f32)
    starts = qsl.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        a, b = starts[i], starts[i + 1]
        q_len, ctx = b - a, seq_len - (b - a)
        if q_len == 0:
            continue
        hidden = torch.ones(q_len, q_len, dtype=torch.bool, device=q.device).triu_(1)
        blocks = table[i, : -(-ctx // block_size)].long()
        k_pre = k_cache[blocks].flatten(0, 1)[:ctx].float()  # [ctx, num_kv_heads, head_dim]
        v_pre = v_cache[blocks].flatten(0, 1)[:ctx].float()
        for kh in range(num_kv_heads):
            heads = slice(kh * group, (kh + 1) * group)
            qi = q[a:b, heads].float().transpose(0, 1)  # [group, q_len, head_dim]
            kc, vc = k[a:b, kh].float(), v[a:b, kh].float()
            s = torch.matmul(qi, kc.T) * scale  # [group, q_len, q_len]
            s.masked_fill_(hidden, float("-inf"))
            chunk_lse[a:b, heads] = (torch.logsumexp(s, -1) * LOG2E).T
            o = torch.matmul(torch.softmax(s, -1), vc)
            chunk_out[a:b, heads] = o.transpose(0, 1)
            if ctx:
                s = torch.cat([torch.matmul(qi, k_pre[:, kh].T) * scale, s], dim=-1)
                o = torch.matmul(torch.softmax(s, -1), torch.cat([v_pre[:, kh], vc]))
            final_out[a:b, heads] = o.transpose(0, 1)
            del s, o
    return {"chunk_out": chunk_out, "chunk_lse": chunk_lse, "final_out": final_out}


def token_positions(qsl: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, position in its chunk) of every token (CPU int64); -1 for padding."""
    seq = torch.full((num_tokens,), -1, dtype=torch.int64)
    pos = torch.full((num_tokens,), -1, dtype=torch.int64)
    starts = qsl.tolist()
    for i in range(len(starts) - 1):
        seq[starts[i] : starts[i + 1]] = i
        pos[starts[i] : starts[i + 1]] = torch.arange(starts[i + 1] - starts[i])
    return seq, pos


def _hist(values: torch.Tensor, size: int) -> list[int]:
    return torch.bincount(values, minlength=size).tolist()


def analyze(out, ref, lse, ref_lse, seq_of, pos_of, block_m: int) -> dict[str, Any]:
    """Classify the (token, head) rows of `out` against `ref`; `lse` may be None."""
    o, ref = out.float(), ref.float()
    num_tokens, num_heads, head_dim = o.shape
    real = (seq_of >= 0).to(o.device)[:, None].expand(num_tokens, num_heads)
    nan_el = o.isnan() & real[:, :, None]
    nan_row = nan_el.any(-1)
    inf_row = o.isinf().any(-1) & ~nan_row & real
    unwritten = (o == SENTINEL).all(-1) & real
    err = (o - ref).abs().amax(-1)
    finite = real & ~nan_row & ~inf_row & ~unwritten
    zero = finite & (o == 0).all(-1) & (ref.abs().amax(-1) > MAX_ABS)
    wrong = finite & (err > MAX_ABS)
    n_rows = int(real.sum())
    err_f = torch.where(finite, err, torch.zeros_like(err))
    diff = torch.where(finite[:, :, None], o - ref, torch.zeros_like(o))
    ref_f = torch.where(finite[:, :, None], ref, torch.zeros_like(ref))
    res: dict[str, Any] = {
        "rows": n_rows,
        "nan_rows": int(nan_row.sum()),
        "nan_row_frac": float(nan_row.sum()) / max(1, n_rows),
        "nan_element_frac": float(nan_el.sum()) / max(1, n_rows * head_dim),
        "inf_rows": int(inf_row.sum()),
        "unwritten_rows": int(unwritten.sum()),
        "zero_rows": int(zero.sum()),
        "wrong_rows": int(wrong.sum()),
        "max_abs_finite": float(err_f.max()) if n_rows else 0.0,
        "rel_l2_finite": float(diff.norm() / ref_f.norm().clamp_min(1e-30)),
    }
    tile_of = torch.where(pos_of >= 0, pos_of // block_m, 0)
    row_of = torch.where(pos_of >= 0, pos_of % block_m, 0)
    n_tiles = int(tile_of.max()) + 1 if num_tokens else 1
    lse_c = lse.float().cpu() if lse is not None else None
    err_c = err.cpu()
    for name, mask in (("nan", nan_row), ("inf", inf_row), ("unwritten", unwritten),
                       ("zero", zero), ("wrong", wrong)):  # fmt: skip
        mask = mask.cpu()
        if not mask.any():
            continue
        tok, head = mask.nonzero(as_tuple=True)
        examples = []
        for t, h in zip(tok[:EXAMPLES].tolist(), head[:EXAMPLES].tolist()):
            ex = {"token": t, "seq": int(seq_of[t]), "pos": int(pos_of[t]), "head": h,
                  "tile": int(tile_of[t]), "row_in_tile": int(row_of[t])}  # fmt: skip
            if name == "nan":
                ex["nan_dims"] = int(nan_el[t, h].sum())
            elif name in ("wrong", "zero", "inf"):
                ex["abs_err"] = float(err_c[t, h])
            if lse_c is not None:
                ex["lse"] = float(lse_c[t, h])
            examples.append(ex)
        res[name] = {
            "count": int(mask.sum()),
            "examples": examples,
            "by_row_in_tile": _hist(row_of[tok], block_m),
            "by_tile": _hist(tile_of[tok], n_tiles),
            "by_head": _hist(head, num_heads),
            "by_seq": _hist(seq_of[tok], int(seq_of.max()) + 1),
        }
        if lse_c is not None:
            at = lse_c[tok, head]
            res[name]["lse_at_rows"] = {
                "nan": int(at.isnan().sum()), "neg_inf": int((at == float("-inf")).sum()),
                "unwritten": int((at == LSE_SENTINEL).sum()), "finite": int(at.isfinite().sum()),
            }  # fmt: skip
    by_tile = torch.zeros(n_tiles)
    by_tile.scatter_reduce_(0, tile_of.repeat_interleave(num_heads), err_f.cpu().flatten(), "amax")
    res["max_abs_by_tile"] = [round(x, 5) for x in by_tile.tolist()]
    if lse is not None:
        lf = lse.float()
        real_l = real
        l_unw = (lf == LSE_SENTINEL) & real_l
        l_fin = lf.isfinite() & ~l_unw & real_l
        l_err = torch.where(l_fin, (lf - ref_lse).abs(), torch.zeros_like(lf))
        res["lse"] = {
            "nan": int((lf.isnan() & real_l).sum()),
            "neg_inf": int(((lf == float("-inf")) & real_l).sum()),
            "pos_inf": int(((lf == float("inf")) & real_l).sum()),
            "unwritten": int(l_unw.sum()),
            "wrong": int((l_err > LSE_TOL).sum()),
            "max_abs": float(l_err.max()) if n_rows else 0.0,
        }
    return res


def _rows(values: list, per_line: int = 32, fmt: str = "{}") -> list[str]:
    return [" ".join(fmt.format(x) for x in values[i : i + per_line])
            for i in range(0, len(values), per_line)]  # fmt: skip


def print_analysis(label: str, res: dict[str, Any], block_m: int) -> None:
    bad = res["nan_rows"] or res["inf_rows"] or res["unwritten_rows"] or res["wrong_rows"]
    verdict = "WRONG" if bad else "ok"
    print(f"  {label:<16} {verdict:<5} rows {res['rows']}: NaN {res['nan_rows']} "
          f"({100 * res['nan_row_frac']:.2f} % of rows, {100 * res['nan_element_frac']:.2f} % of "
          f"elements), inf {res['inf_rows']}, unwritten {res['unwritten_rows']}, all-zero "
          f"{res['zero_rows']}, finite but wrong {res['wrong_rows']}; finite rows: max_abs "
          f"{res['max_abs_finite']:.3g} rel_l2 {res['rel_l2_finite']:.3g}", flush=True)  # fmt: skip
    if "lse" in res:
        lse = res["lse"]
        print(f"    lse (before the merge): NaN {lse['nan']}, -inf {lse['neg_inf']}, +inf "
              f"{lse['pos_inf']}, unwritten {lse['unwritten']}, wrong (> {LSE_TOL}) "
              f"{lse['wrong']}, max_abs {lse['max_abs']:.3g}")  # fmt: skip
    for name in ("nan", "inf", "unwritten", "zero", "wrong"):
        if name not in res:
            continue
        c = res[name]
        print(f"    {name} rows: {c['count']}")
        if "lse_at_rows" in c:
            print(f"      their lse: {c['lse_at_rows']}")
        print(f"      first {len(c['examples'])} (pos: in the chunk; tile = pos // {block_m}):")
        for ex in c["examples"]:
            fields = (f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in ex.items())
            print("        " + " ".join(fields))
        half = block_m // 2
        lo, hi = sum(c["by_row_in_tile"][:half]), sum(c["by_row_in_tile"][half:])
        print(f"      by pos % {block_m} (the two consumer warpgroups: rows < {half}: {lo}, "
              f">= {half}: {hi}):")  # fmt: skip
        for line in _rows(c["by_row_in_tile"]):
            print(f"        {line}")
        print(f"      by tile (pos // {block_m}):")
        for line in _rows(c["by_tile"]):
            print(f"        {line}")
        print(f"      by head: {' '.join(map(str, c['by_head']))}; by sequence: {c['by_seq']}")
    if bad:
        print(f"    max abs error by tile (finite rows, tile = pos // {block_m}):")
        for line in _rows(res["max_abs_by_tile"], 16, "{:.3g}"):
            print(f"      {line}")


def compiled_kernels(jit_fn, dump: str | None, tag: str) -> list[dict[str, Any]]:
    """What Triton compiled for jit_fn in this process (none under the interpreter)."""
    infos: list[dict[str, Any]] = []
    caches = getattr(jit_fn, "device_caches", None)
    if not caches:
        return infos
    try:
        for device_cache in caches.values():
            for kernel in device_cache[0].values():
                consts = {  # keyed by argument paths: (index,) for a plain argument
                    jit_fn.arg_names[k[0]]: v
                    for k, v in kernel.src.constants.items()
                    if isinstance(k, tuple) and len(k) == 1 and isinstance(k[0], int)
                }
                ttgir = kernel.asm.get("ttgir", "")
                meta = kernel.metadata._asdict()
                warps = {k: v for k, v in meta.items() if "warp" in k and k != "num_warps"}
                info = {
                    "hash": kernel.hash[:12],
                    **{k: consts.get(k) for k in ("BLOCK_M", "BLOCK_N", "HOST_DESC", "WARP_SPEC")},
                    "num_warps": kernel.metadata.num_warps,
                    **warps,  # the partitions' warps, where Triton records them
                    "num_stages": getattr(kernel.metadata, "num_stages", None),
                    "shared_bytes": kernel.metadata.shared,
                    "global_scratch_bytes": getattr(kernel.metadata, "global_scratch_size", None),
                    "n_regs": getattr(kernel, "n_regs", None),
                    "n_spills": getattr(kernel, "n_spills", None),
                    "ttgir_warp_specialize": "ttg.warp_specialize" in ttgir,
                    "ttgir_partitions": ttgir.count("partition"),
                }
                infos.append(info)
                if dump:
                    Path(dump).mkdir(parents=True, exist_ok=True)
                    name = f"{tag}_ws{int(bool(info['WARP_SPEC']))}_{info['hash']}"
                    for ext in ("ttgir", "ptx"):
                        path = Path(dump) / f"{name}.{ext}"
                        if ext in kernel.asm and not path.exists():
                            path.write_text(kernel.asm[ext])
    except Exception as e:  # a layout of a future Triton: the rest of the report still counts
        infos.append({"error": f"{type(e).__name__}: {e}"})
    return infos


def run_variant(name, ctx) -> dict[str, Any]:
    """One call of a variant on fresh sentinel buffers; analyses of each stage."""
    from kernels import dense_prefill_attention as dense
    from kernels import dense_prefill_ws as ws

    q, k, v, k_cache, v_cache, table, seq_lens, qsl, max_q, scale = ctx["args"]
    cfg, ref, seq_of, pos_of = ctx["cfg"], ctx["ref"], ctx["seq_of"], ctx["pos_of"]
    out = torch.full_like(q, SENTINEL)
    t0 = time.perf_counter()
    res: dict[str, Any] = {}
    if name == "plain":
        step(f"{name}: dense_prefill_attention (default config), compile and launch")
        dense.dense_prefill_attention(q, k, v, k_cache, v_cache, table, seq_lens, qsl, max_q,
                                      scale, out=out)  # fmt: skip
        sync()
        res["first_call_s"] = time.perf_counter() - t0
        res["final"] = analyze(out, ref["final_out"], None, None, seq_of, pos_of, cfg.block_m)
        return res
    if name == "ws-sep":
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    qk_scale = float(scale) * LOG2E
    lse = torch.full(q.shape[:2], LSE_SENTINEL, dtype=torch.float32, device=q.device)
    step(f"{name}: chunk kernel, compile and launch (warp_specialize={name != 'ws-off'})")
    ws.ws_chunk(q, k, v, qsl, max_q, qk_scale, out, cfg, lse=lse,
                warp_specialize=name != "ws-off")  # fmt: skip
    step(f"{name}: chunk kernel queued, synchronizing")
    sync()
    res["first_call_s"] = time.perf_counter() - t0
    step(f"{name}: chunk kernel done in {res['first_call_s']:.1f} s")
    res["chunk"] = analyze(out, ref["chunk_out"], lse, ref["chunk_lse"], seq_of, pos_of,
                           cfg.block_m)  # fmt: skip
    chunk_out = out.clone()
    group = q.shape[1] // k.shape[1]
    merge_cfg = dense._short_tiles(dense.CONFIG_PLAIN, max_q * group)
    step(f"{name}: prefix merge kernel, compile and launch")
    ws.ws_merge(q, k_cache, v_cache, table, seq_lens, qsl, max_q, qk_scale, out, lse, merge_cfg)
    sync()
    step(f"{name}: merge done")
    res["final"] = analyze(out, ref["final_out"], None, None, seq_of, pos_of, cfg.block_m)
    prefix_free = bool((seq_lens.cpu() == (qsl[1:] - qsl[:-1]).cpu()).all())
    changed = out.view(torch.int16) != chunk_out.view(torch.int16)
    res["merge_changed_elements"] = int(changed.sum())
    res["prefix_free"] = prefix_free
    ctx["outputs"][name] = out
    return res


def child_main(spec: dict[str, Any]) -> int:
    smoke, case = spec["smoke"], tuple(spec["case"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    from benchmarks.sweeps import prefill_cases as cases
    from kernels import dense_prefill_ws as ws

    cfg = parse_config(spec["config"])
    dims = SMOKE_DIMS if smoke else DIMS
    step(f"{case_label(case)}: inputs (seed {spec['seed']}) and the fp32 reference")
    inp = cases.make_inputs(case, dims, device, seed=spec["seed"])
    q, k, v, k_cache, v_cache, table, seq_lens, qsl, _, scale = inp["args"]
    ref = reference(q, k, v, k_cache, v_cache, table, seq_lens, qsl, scale)
    sync()
    seq_of, pos_of = token_positions(qsl.cpu(), q.shape[0])
    ctx = {"args": inp["args"], "cfg": cfg, "ref": ref, "seq_of": seq_of, "pos_of": pos_of,
           "outputs": {}}  # fmt: skip
    result: dict[str, Any] = {"case": list(case), "variants": {}}
    for name in spec["variants"]:
        try:
            r = run_variant(name, ctx)
        except Exception as e:  # a compile or launch error: the next variant still runs
            r = {"error": f"{type(e).__name__}: {str(e).strip()[:600]}"}
            print(f"  {name:<16} FAILED {r['error']}", flush=True)
        result["variants"][name] = r
        for stage in ("chunk", "final"):
            if stage in r:
                print_analysis(f"{name}/{stage}", r[stage], cfg.block_m)
        if "merge_changed_elements" in r and r["prefix_free"] and r["merge_changed_elements"]:
            print(f"    the merge changed {r['merge_changed_elements']} elements of a "
                  "prefix-free batch (it should return at once)")  # fmt: skip
    outs = ctx["outputs"]
    cmp: dict[str, Any] = {}
    for a, b in (("ws", "ws-again"), ("ws", "ws-off"), ("ws", "ws-sep")):
        if a in outs and b in outs:
            x, y = outs[a], outs[b]
            same_bits = x.view(torch.int16) == y.view(torch.int16)
            both = x.isfinite() & y.isfinite()
            d = torch.where(both, (x.float() - y.float()).abs(), torch.zeros_like(x.float()))
            cmp[f"{a} vs {b}"] = {
                "bit_identical": bool(same_bits.all()),
                "elements_differing": int((~same_bits).sum()),
                "nan_masks_equal": bool((x.isnan() == y.isnan()).all()),
                "max_abs_diff_finite": float(d.max()),
            }
            print(f"  {a} vs {b}: {cmp[f'{a} vs {b}']}", flush=True)
    result["comparisons"] = cmp
    result["compiled_chunk_kernels"] = compiled_kernels(ws._ws_chunk_kernel, spec.get("dump"),
                                                        "chunk")  # fmt: skip
    for info in result["compiled_chunk_kernels"]:
        print(f"  compiled chunk kernel: {info}", flush=True)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# Parent: every case in a child under a timeout
# ---------------------------------------------------------------------------------------------
_RUNNING: list[subprocess.Popen] = []  # the case's child (its own session: `timeout` misses it)


def _on_sigterm(signum, frame) -> None:
    """The job's `timeout` cuts the run: the running case's child goes too (it holds the GPU
    the next step of the job needs); the JSON already holds every case that ended."""
    for proc in _RUNNING:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    log("cut short by SIGTERM: the running case's child killed")
    sys.exit(128 + signum)


def run_case(spec: dict[str, Any], timeout: float, smoke: bool, cmd=None) -> dict[str, Any]:
    """One case in a child (cmd: another command line, for tests) under `timeout`."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    if smoke:
        env["TRITON_INTERPRET"] = "1"
    t0 = time.monotonic()
    cmd = cmd or [sys.executable, __file__, "--child", json.dumps(spec)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    _RUNNING.append(proc)
    seen: dict[str, Any] = {"step": None, "result": None, "tail": []}

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                seen["result"] = json.loads(line[len("RESULT ") :])
                continue
            if line.startswith("@step "):
                seen["step"] = line[len("@step ") :].strip()
            seen["tail"] = [*seen["tail"][-7:], line.rstrip()]
            print(line, end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    status = "ok"
    try:
        rc = proc.wait(timeout=timeout)
        if rc != 0 or seen["result"] is None:
            status = f"died (rc {rc})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and what it started
        proc.wait()
        status = f"HANG: killed after {timeout:.0f} s"
    reader.join(timeout=10)
    _RUNNING.remove(proc)
    entry = {"case": spec["case"], "label": case_label(spec["case"]), "status": status,
             "last_step": seen["step"], "seconds": time.monotonic() - t0,
             "result": seen["result"]}  # fmt: skip
    if status != "ok":
        log(f"{entry['label']}: {status}; last step: {seen['step']}")
        if status.startswith("died"):
            print("\n".join(f"    | {ln}" for ln in seen["tail"]), flush=True)
    return entry


def _cell(v: dict[str, Any] | None, stage: str) -> str:
    if v is None:
        return "-"
    if "error" in v:
        return "error"
    r = v.get(stage)
    if r is None:
        return "-"
    if r["nan_rows"]:
        return f"NaN {100 * r['nan_row_frac']:.1f}%"
    if r["unwritten_rows"]:
        return f"unwritten {r['unwritten_rows']}"
    if r["inf_rows"]:
        return f"inf {r['inf_rows']}"
    if r["wrong_rows"]:
        return f"wrong {r['wrong_rows']} ({r['max_abs_finite']:.2g})"
    return f"ok {r['max_abs_finite']:.1e}"


def summarize(report: dict[str, Any]) -> None:
    print(f"\n==== prefill ws diagnose summary ({report['config']} ws, {report['device']})")
    cols = ["plain", "ws-off/chunk", "ws-off", "ws/chunk", "ws", "ws-again", "ws-sep"]
    header = f"  {'case':<18} {'status':<8} " + " ".join(f"{c:<16}" for c in cols)
    print(header.rstrip())
    for entry in report["cases"]:
        res = entry["result"] or {}
        variants = res.get("variants", {})
        cells = []
        for c in cols:
            name, _, stage = c.partition("/")
            cells.append(_cell(variants.get(name), stage or "final"))
        status = "ok" if entry["status"] == "ok" else entry["status"].split(":")[0]
        line = f"  {entry['label']:<18} {status:<8} " + " ".join(f"{c:<16}" for c in cells)
        print(line.rstrip())
        if entry["status"] != "ok":
            print(f"    {entry['status']}; last step: {entry['last_step']}")
        for pair, c in res.get("comparisons", {}).items():
            if not c["bit_identical"]:
                why = ": a race (or uninitialised memory)" if pair == "ws vs ws-again" else ""
                print(f"    {pair}: {c['elements_differing']} elements differ, max abs diff of "
                      f"finite ones {c['max_abs_diff_finite']:.3g}{why}")  # fmt: skip
    print("  (cells: the final output unless /chunk; NaN % of (token, head) rows; unwritten: "
          f"rows still {SENTINEL}; wrong: finite rows off by > {MAX_ABS})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(json.loads(argv[1]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help=f"BLOCK_M/BLOCK_N/warps/stages [tma] (default {CONFIG})")
    ap.add_argument("--seed", type=int, default=0, help="inputs' seed (the sweep's: 0)")
    ap.add_argument("--budget", type=float, help=f"seconds for every case (default {BUDGET_S})")
    ap.add_argument("--case-timeout", type=float, default=CASE_TIMEOUT_S)
    ap.add_argument("--first-timeout", type=float, default=FIRST_TIMEOUT_S)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--dump", help="write the compiled chunk kernels' TTGIR and PTX here")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke:  # before kernels.* is imported (decided at @triton.jit)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    config = args.config or (SMOKE_CONFIG if smoke else CONFIG)
    budget = args.budget or (600.0 if smoke else BUDGET_S)
    first_timeout = max(args.first_timeout, 240.0) if smoke else args.first_timeout
    case_timeout = max(args.case_timeout, 120.0) if smoke else args.case_timeout
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)"
    log(f"device: {device} | torch {torch.__version__} | triton {triton.__version__} | "
        f"config {config} ws | budget {budget:.0f} s")  # fmt: skip
    report: dict[str, Any] = {"device": device, "torch": torch.__version__,
                              "triton": triton.__version__, "config": config, "seed": args.seed,
                              "sentinel": SENTINEL, "max_abs": MAX_ABS, "cases": []}  # fmt: skip
    deadline = time.monotonic() + budget
    for i, case in enumerate(SMOKE_CASES if smoke else CASES):
        left = deadline - time.monotonic()
        if left < 8:
            log(f"{case_label(case)}: skipped, out of time")
            report["cases"].append({"case": list(case), "label": case_label(case),
                                    "status": "skipped: out of time", "last_step": None,
                                    "seconds": 0.0, "result": None})  # fmt: skip
            continue
        timeout = min(left, first_timeout if i == 0 else case_timeout)
        log(f"{case_label(case)}: child, timeout {timeout:.0f} s")
        spec = {"case": list(case), "config": config, "seed": args.seed, "smoke": smoke,
                "variants": args.variants.split(","), "dump": args.dump}  # fmt: skip
        report["cases"].append(run_case(spec, timeout, smoke))
        if args.json:  # after every case: a job cut short keeps what ran
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    summarize(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
