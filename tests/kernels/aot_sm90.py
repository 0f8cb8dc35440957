# Ahead-of-time compile of every kernel for sm_90 (H100/H200) on any machine, GPU or not:
# Triton's NVIDIA backend and ptxas ship in the triton wheel. This catches compiled-mode errors
# that the CPU interpreter cannot see (unsupported constructs, dot shapes, shared memory over the
# Hopper limit). Run as `python -m tests.kernels.aot_sm90` WITHOUT TRITON_INTERPRET (interpreted
# kernels cannot be compiled); prints one JSON line per kernel variant. wgmma_serialized: ptxas's
# "wgmma.mma_async instructions are serialized" notes (C751x), each a lost overlap of tensor-core
# work, found by running the bundled ptxas -v again on the PTX.
# Uses Triton's compiler entry points (ASTSource, GPUTarget) as of triton 3.6.
#
# Triton caches the compiles themselves (~/.triton/cache); ptxas -v is run again for each wgmma
# variant, about three quarters of a warm run (14 of 18 s on a 2-core machine), so its notes are
# kept on disk too (ptxas_notes below).
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import dense_prefill_attention as dense
from kernels import dense_prefill_ws as dense_ws
from kernels import fp8_quant, rms_norm, rotary, rotary_store_kv, silu_mul, skinny_gemm, store_kv
from kernels import paged_decode_attention as pda
from kernels import paged_prefill_attention as ppa
from kernels import shared_prefix_decode as spd
from kernels.paged_decode_walks import WALK_CODES, WALKS, walk_layout
from tests.kernels.ttgir_rows import rows_problem, tma_box_mismatches

TARGET = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 232448  # max shared memory per block on sm_90
DIVISIBLE_INTS = {"k_per_split"}  # skinny_gemm: whole BLOCK_K tiles


def _ptxas() -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@functools.cache
def _notes_dir() -> Path | None:
    """Where the notes are kept between runs: a directory of this user's under the temp dir
    (outside the checkout, so CI's fresh clone on the same machine finds it too). None when it
    is someone else's or not a plain directory: notes read from a directory another user can
    write to could hide a serialized wgmma, so then every run asks ptxas."""
    path = Path(tempfile.gettempdir()) / f"fleetlm-aot-sm90-{os.geteuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if path.is_symlink() or not path.is_dir() or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return path


@functools.cache
def _ptxas_identity() -> str:
    """The bundled ptxas, as far as its output can differ: a new triton wheel brings another."""
    st = _ptxas().stat()
    return f"{_ptxas()}:{st.st_size}:{st.st_mtime_ns}:{triton.__version__}"


@functools.cache
def ptxas_notes(ptx: str, maxnreg: int | None) -> list[str]:
    """The performance notes (C75xx codes) of triton's bundled ptxas -v on `ptx` for sm_90a,
    from the disk when this ptxas has seen the same PTX and register cap before (its output is
    a function of those: the key is their hash)."""
    key = hashlib.sha256(f"{_ptxas_identity()}\n{maxnreg}\n{ptx}".encode()).hexdigest()
    cached = _notes_dir() / f"{key}.json" if _notes_dir() else None
    if cached is not None and cached.is_file():
        try:
            return json.loads(cached.read_text())
        except ValueError:  # a write cut short: ask ptxas again
            pass
    notes, ok = _run_ptxas(ptx, maxnreg)
    if cached is not None and ok:  # a failed run is not kept: the next one tries again
        # Written whole, then renamed: a concurrent run never reads half a file.
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(notes))
        tmp.replace(cached)
    return notes


def _run_ptxas(ptx: str, maxnreg: int | None) -> tuple[list[str], bool]:
    ptxas = _ptxas()
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(d) / "k.cubin")]
        cmd += [f"--maxrregcount={maxnreg}"] if maxnreg else []
        run = subprocess.run(cmd, capture_output=True, text=True)
    return sorted(set(re.findall(r"\((C75\d\d)\)", run.stderr))), run.returncode == 0


def compile_sm90(fn, ptr_types, float_args, constexprs, num_warps, num_stages, maxnreg=None):
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif ptr_types.get(name, "").startswith("tensordesc"):  # a host TensorDescriptor
            signature[name] = ptr_types[name]
        elif name in ptr_types:
            signature[name] = "*" + ptr_types[name]
        elif name in float_args:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    # what a JIT launch specialises on real tensors: 16-byte aligned pointers, strides % 16 == 0,
    # and the ints the launchers keep at multiples of 16 (without that Triton cannot prove the
    # loads aligned and does not pipeline them through cp.async)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if signature[name].startswith("*") or name.startswith("stride_") or name in DIVISIBLE_INTS
    }
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    options.update({"maxnreg": maxnreg} if maxnreg else {})
    kernel = triton.compile(src, target=TARGET, options=options)
    ptx = kernel.asm["ptx"]
    wgmma = len(re.findall(r"wgmma\.mma_async", ptx))
    ttgir = kernel.asm["ttgir"]
    ws = "ttg.warp_specialize" in ttgir
    return {
        "kernel": fn.__name__,
        "constexprs": {k: str(v) for k, v in constexprs.items()},
        "num_warps": num_warps,
        "num_stages": num_stages,
        "maxnreg": maxnreg,
        "cubin": "cubin" in kernel.asm,
        "shared": kernel.metadata.shared,
        "smem_ok": kernel.metadata.shared <= SMEM_LIMIT,
        "cp_async": len(re.findall(r"cp\.async", ptx)),
        "wgmma": wgmma,
        "wgmma_serialized": ptxas_notes(ptx, maxnreg) if wgmma else [],
        "mma_sync": len(re.findall(r"mma\.sync", ptx)),
        "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
        "spill_stores": len(re.findall(r"st\.local", ptx)),
        # warp-specialized: do the consumer warpgroups split the tile's rows, and does every
        # copy-engine load fill a buffer of its box's shape (tests/kernels/ttgir_rows.py)
        "warp_specialized": ws,
        "ws_rows_problem": rows_problem(ttgir, constexprs["BLOCK_M"]) if ws else None,
        "tma_box_mismatches": tma_box_mismatches(ttgir),
    }


def variants(dt: str = "bf16"):
    fp8 = "fp8e4nv"  # e4m3: the FP8 KV cache and FP8 activations
    for quantize in (False, True):
        cache = fp8 if quantize else dt
        yield (
            store_kv._store_kv_kernel,
            {"key_ptr": dt, "value_ptr": dt, "k_cache_ptr": cache, "v_cache_ptr": cache,
             "slot_mapping_ptr": "i64"},
            ("k_scale", "v_scale"),
            {"BLOCK_SIZE": 16, "BLOCK_H": 8, "BLOCK_D": 128, "QUANTIZE": quantize,
             "ROUND_IN_FP32": False},
            4, 1,
        )  # fmt: skip
    for static in (False, True):
        yield (
            fp8_quant._quantize_fp8_kernel,
            {"x_ptr": dt, "q_ptr": fp8, "scale_ptr": "fp32", "static_scale_ptr": "fp32"},
            ("scale_ub",), {"STATIC": static, "BLOCK_K": 2048, "ROUND_IN_FP32": False}, 8, 1,
        )  # fmt: skip
    # plain, and with e4m3 output for an FP8 layer (the 70B's hidden: 8192) as the engine runs it
    norms = ((True, False, False, 4096), (False, False, False, 4096),
             (True, True, False, 8192), (False, True, True, 8192))  # fmt: skip
    for residual, quant, static, block_n in norms:
        yield (
            rms_norm._rms_norm_kernel,
            {"x_ptr": dt, "residual_ptr": dt, "weight_ptr": dt, "out_ptr": fp8 if quant else dt,
             "residual_out_ptr": dt, "scale_ptr": "fp32", "static_scale_ptr": "fp32"},
            ("eps", "scale_ub"),
            {"HAS_RESIDUAL": residual, "BLOCK_N": block_n, "QUANT": quant, "STATIC": static,
             "ROUND_IN_FP32": False},
            4 if block_n <= 4096 else 8, 1,
        )  # fmt: skip
    yield (
        rotary._rotary_kernel,
        {"q_ptr": dt, "k_ptr": dt, "positions_ptr": "i64", "cos_sin_ptr": "fp32"},
        (), {"HALF": 64, "BLOCK_HALF": 64, "BLOCK_H": 32}, 4, 1,
    )  # fmt: skip
    for quantize in (False, True):
        cache = fp8 if quantize else dt
        yield (
            rotary_store_kv._rotary_store_kv_kernel,
            {"q_ptr": dt, "k_ptr": dt, "v_ptr": dt, "positions_ptr": "i64", "cos_sin_ptr": "fp32",
             "k_cache_ptr": cache, "v_cache_ptr": cache, "slot_mapping_ptr": "i64"},
            ("k_scale", "v_scale"),
            {"HALF": 64, "BLOCK_HALF": 64, "BLOCK_H": 32, "BLOCK_SIZE": 16, "QUANTIZE": quantize,
             "ROUND_IN_FP32": False},
            4, 1,
        )  # fmt: skip
    yield silu_mul._silu_and_mul_kernel, {"x_ptr": dt, "out_ptr": dt}, (), {"BLOCK": 1024}, 4, 1
    for static in (False, True):
        yield (
            silu_mul._silu_and_mul_fp8_kernel,
            {"x_ptr": dt, "q_ptr": fp8, "scale_ptr": "fp32", "static_scale_ptr": "fp32"},
            ("scale_ub",), {"STATIC": static, "BLOCK": 2048, "ROUND_IN_FP32": False}, 8, 1,
        )  # fmt: skip
    # 16-bit (the 8B's projections) and W8A8 e4m3 (the 70B's, as the engine's FP8 layers run)
    for (m, n, k), e4m3 in (((1, 6144, 4096), False), ((32, 4096, 4096), False),
                            ((64, 4096, 14336), False), ((64, 28672, 4096), False),
                            ((1, 10240, 8192), True), ((64, 8192, 28672), True)):  # fmt: skip
        size = 1 if e4m3 else 2
        cfg = skinny_gemm.default_config(m, n, k, w_bytes=size, x_bytes=size)
        operand = fp8 if e4m3 else dt
        yield (
            skinny_gemm._skinny_gemm_kernel,
            {"x_ptr": operand, "w_ptr": operand, "out_ptr": dt, "w_scale_ptr": "fp32",
             "x_scale_ptr": "fp32", "partial_ptr": "fp32", "counter_ptr": "i32"},
            (),
            {"BLOCK_M": skinny_gemm.block_m_for(m), "BLOCK_N": cfg.block_n,
             "BLOCK_K": cfg.block_k, "SPLIT_K": cfg.split_k, "EVEN_N": True,
             "W_SCALED": e4m3, "X_SCALED": e4m3, "UPCAST": False, "PRECISION": "tf32"},
            cfg.num_warps, cfg.num_stages,
        )  # fmt: skip
    for (group, head_dim), kv_fp8 in (((4, 128), False), ((8, 64), False), ((1, 128), False),
                                      ((8, 128), True)):  # fmt: skip
        cache = fp8 if kv_fp8 else dt
        kv = {"k_cache_ptr": cache, "v_cache_ptr": cache, "block_tables_ptr": "i32",
              "seq_lens_ptr": "i32", "seq_order_ptr": "i32"}  # fmt: skip
        block_n, warps, stages = pda.decode_launch(head_dim, kv_fp8)
        widen = pda.FP8_WIDEN_CODES[pda.FP8_WIDEN] if kv_fp8 else 0
        # (one split, order, key_start): the last is shared-prefix decode's suffix pass; every
        # walk as the launcher sets it up (walk_layout), the other walks in two of them
        for walk in WALKS:
            ran, block_g, lanes = walk_layout(walk, group, 16)
            if ran != walk:  # runs as "keys" at this group
                continue
            launches = ((True, True, False), (True, False, False), (False, True, False),
                        (False, True, True))  # fmt: skip
            for one_split, has_order, key_start in launches[:: 1 if walk == "keys" else 3]:
                yield (
                    pda._decode_split_kernel,
                    {"q_ptr": dt, "out_ptr": dt, "part_max_ptr": "fp32", "part_sum_ptr": "fp32",
                     "part_acc_ptr": "fp32", "key_start_ptr": "i32", **kv},
                    ("qk_scale", "v_scale"),
                    {"GROUP": group, "BLOCK_G": block_g, "HEAD_DIM": head_dim,
                     "BLOCK_SIZE": 16, "BLOCK_N": block_n, "NUM_SPLITS_IS_ONE": one_split,
                     "HAS_ORDER": has_order, "HAS_KEY_START": key_start, "KV_FP8": kv_fp8,
                     "FP8_WIDEN": widen, "UPCAST_DOT": False, "DOT_PRECISION": "tf32",
                     "WALK": WALK_CODES[walk], "LANES": lanes},
                    warps, stages,
                )  # fmt: skip
        # shared-prefix decode's prefix kernel at the engine's 16 rows a group
        rows = 16  # engine/core/prefix_groups.py: MAX_ROWS
        block_m = max(16, pda.next_power_of_2(rows * group))
        p_block_n, p_warps, p_stages = spd.prefix_launch(block_m, head_dim)
        if kv_fp8:
            p_block_n = min(2 * p_block_n, spd.PREFIX_FP8_MAX_BLOCK_N)
        yield (
            spd._prefix_split_kernel,
            {"q_ptr": dt, "part_max_ptr": "fp32", "part_sum_ptr": "fp32", "part_acc_ptr": "fp32",
             "group_rows_ptr": "i32", "prefix_lens_ptr": "i32", **kv},
            ("qk_scale", "v_scale"),
            {"GROUP": group, "MAX_ROWS": rows, "BLOCK_M": block_m,
             "HEAD_DIM": head_dim, "BLOCK_SIZE": 16, "BLOCK_N": p_block_n, "KV_FP8": kv_fp8,
             "FP8_WIDEN": widen, "UPCAST_DOT": False, "DOT_PRECISION": "tf32"},
            p_warps, p_stages,
        )  # fmt: skip
        yield (
            pda._decode_reduce_kernel,
            {"part_max_ptr": "fp32", "part_sum_ptr": "fp32", "part_acc_ptr": "fp32", "out_ptr": dt},
            (), {"HEAD_DIM": head_dim, "BLOCK_S": 32,
                 "BLOCK_H": pda.reduce_heads_per_program(32, group, 32)}, 4, 1,
        )  # fmt: skip
        # whole chunks in one key range; a short chunk's rows, one range or split
        for block_m, split in ((ppa.BLOCK_M_16BIT, False), (16, False), (16, True)):
            yield (
                ppa._prefill_kernel,
                {"q_ptr": dt, "out_ptr": dt, "query_start_loc_ptr": "i32", "part_max_ptr": "fp32",
                 "part_sum_ptr": "fp32", "part_acc_ptr": "fp32", **kv},
                ("qk_scale", "v_scale"),
                {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_SIZE": 16, "BLOCK_M": block_m,
                 "BLOCK_N": ppa.BLOCK_N_DEFAULT, "KV_FP8": kv_fp8, "UPCAST_DOT": False,
                 "DOT_PRECISION": "tf32", "SPLIT": split},
                8 if block_m >= 128 else 4, ppa.NUM_STAGES,
            )  # fmt: skip
        if kv_fp8:  # the dense path keeps the cache in q's dtype
            continue
        configs = {(dense.CONFIG_16BIT, "i32"), (dense.CONFIG_PLAIN, "i32")}
        if (group, head_dim) == (4, 128):  # Llama-3.1-8B: every config the benchmark times,
            configs.update((c, "i32") for c in dense.CONFIGS_TO_SWEEP + dense.CONFIGS_WARP_SPEC)
            configs.add((dense.CONFIG_16BIT, "i64"))  # and int64 metadata (TMA offsets stay 32-bit)
            configs.add((dense.CONFIG_PLAIN, "i64"))
        for cfg, meta in sorted(configs, key=lambda c: (dense.config_label(c[0]), c[1])):
            yield from _dense_variants(dt, kv, cfg, meta, group, head_dim)


def _dense_variants(dt, kv, cfg, meta, group, head_dim):
    block_m, block_n, num_warps, num_stages, tma, maxnreg, warp_spec = cfg[:7]
    meta_names = ("query_start_loc_ptr", "seq_lens_ptr", "block_tables_ptr")
    meta_ptrs = dict.fromkeys(meta_names, meta)
    common = {"GROUP": group, "HEAD_DIM": head_dim, "UPCAST_DOT": False, "DOT_PRECISION": "tf32"}
    if warp_spec:  # the chunk kernel (q/k/v through descriptors), then the prefix merge
        descs = {
            "k_desc": f"tensordesc<{dt}[{block_n},{head_dim}]>",
            "v_desc": f"tensordesc<{dt}[{block_n},{head_dim}]>",
        }
        yield (
            dense_ws._ws_chunk_kernel,
            {"q_ptr": dt, "k_ptr": dt, "v_ptr": dt, "out_ptr": dt, "lse_ptr": "fp32",
             "query_start_loc_ptr": meta, **(descs if tma else {})},
            ("qk_scale",),
            {**common, "BLOCK_M": block_m, "BLOCK_N": block_n, "HOST_DESC": tma,
             **({} if tma else dict.fromkeys(descs))},
            num_warps, num_stages, None,
        )  # fmt: skip
        merge = dense.CONFIG_PLAIN
        yield (
            dense_ws._prefix_merge_kernel,
            {"q_ptr": dt, "out_ptr": dt, "lse_ptr": "fp32", **kv, **meta_ptrs},
            ("qk_scale",),
            {**common, "BLOCK_SIZE": 16, "BLOCK_M": merge.block_m, "BLOCK_N": merge.block_n},
            merge.num_warps, merge.num_stages, None,
        )  # fmt: skip
        return
    desc = f"tensordesc<{dt}[{block_n},{head_dim}]>"
    yield (
        dense._dense_prefill_kernel,
        {"q_ptr": dt, "k_ptr": dt, "v_ptr": dt, "out_ptr": dt, **kv, **meta_ptrs,
         **({"k_desc": desc, "v_desc": desc} if tma else {})},
        ("qk_scale",),
        {**common, "BLOCK_SIZE": 16, "BLOCK_M": block_m, "BLOCK_N": block_n, "USE_TMA": tma,
         "LAZY": cfg.lazy, **({} if tma else {"k_desc": None, "v_desc": None})},
        num_warps, num_stages, maxnreg,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """--only NAME: the variants of that kernel only (e.g. _ws_chunk_kernel)."""
    argv = sys.argv[1:] if argv is None else argv
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    ok = True
    seen = set()
    for fn, ptrs, floats, constexprs, num_warps, num_stages, *maxnreg in variants():
        if only and fn.__name__ != only:
            continue
        # Some launch paths share a variant (the prefix merge of every prefill config): one
        # compile each, its line the same.
        key = (id(fn), json.dumps([ptrs, floats, constexprs, num_warps, num_stages, maxnreg],
                                  sort_keys=True, default=str))  # fmt: skip
        if key in seen:
            continue
        seen.add(key)
        res = compile_sm90(fn, ptrs, floats, constexprs, num_warps, num_stages, *maxnreg)
        ok &= res["cubin"] and res["smem_ok"]
        ok &= not res["ws_rows_problem"] and not res["tma_box_mismatches"]
        print(json.dumps(res), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
