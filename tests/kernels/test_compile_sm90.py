# The kernels must compile for Hopper (sm_90) even though the other tests run them in the CPU
# interpreter. See aot_sm90.py; it runs once per module, in a subprocess without
# TRITON_INTERPRET, and each test reads what it printed about the variants it cares about.
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.dense_prefill_attention import CONFIG_16BIT, CONFIG_PLAIN

ROOT = Path(__file__).resolve().parents[2]


def _nvidia_backend_available() -> bool:
    try:
        import triton

        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        return ptxas.exists() or os.environ.get("TRITON_PTXAS_PATH") is not None
    except ImportError:
        return False


needs_ptxas = pytest.mark.skipif(
    not _nvidia_backend_available(), reason="triton's NVIDIA backend (ptxas) is not installed"
)


@pytest.fixture(scope="module")
def sm90() -> list[dict]:
    """Every variant's line; the run fails (and with it each test) if any variant did."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.aot_sm90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,  # minutes of compiling on a busy 2-core machine
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
@needs_ptxas
def test_kernels_compile_for_sm90(sm90):
    results = sm90
    assert len(results) >= 10
    for r in results:
        assert r["cubin"], r
        assert r["smem_ok"], r
    # tensor-core dots: mma.sync for the decode group (M = 16), wgmma for 128-row prefill tiles
    names = {r["kernel"] for r in results}
    assert {"_decode_split_kernel", "_prefill_kernel", "_store_kv_kernel"} <= names
    assert "_dense_prefill_kernel" in names
    # the skinny GEMM's weight stream is pipelined (cp.async stages) into wgmma
    skinny = [r for r in results if r["kernel"] == "_skinny_gemm_kernel"]
    assert skinny and all(r["cp_async"] and r["wgmma"] for r in skinny), skinny
    # the dense prefill path's TMA configs load K/V through the copy engine
    assert any(r["tma_loads"] for r in results if r["kernel"] == "_dense_prefill_kernel")
    # the warp-specialized variant compiles (Triton 3.6's Hopper pass), copy engine throughout
    ws = [r for r in results if r["kernel"] == "_ws_chunk_kernel"]
    assert ws and all(r["tma_loads"] and not r["wgmma_serialized"] for r in ws), ws
    # the default plain config keeps its wgmma chains asynchronous (no ptxas C751x note); the
    # 16-bit default is warp-specialized, among the ws kernels above
    assert CONFIG_16BIT.warp_spec
    cfg = CONFIG_PLAIN
    default = [
        r for r in results
        if r["kernel"] == "_dense_prefill_kernel" and r["constexprs"]["HEAD_DIM"] == "128"
        and (r["constexprs"]["BLOCK_M"], r["constexprs"]["BLOCK_N"]) == (str(cfg[0]), str(cfg[1]))
        and (r["num_warps"], r["num_stages"]) == (cfg.num_warps, cfg.num_stages)
    ]  # fmt: skip
    assert default and not any(r["wgmma_serialized"] for r in default), default


@pytest.mark.slow
@needs_ptxas
def test_warp_specialized_consumers_split_the_rows(sm90):
    """Every CONFIGS_WARP_SPEC chunk kernel, as Triton 3.6 warp-specializes it for sm_90: the
    two consumer warpgroups work on rows [0, BLOCK_M / 2) and [BLOCK_M / 2, BLOCK_M) of the
    tile (the H200 found the second one on the next tile's rows: q's load coordinate and the
    row index shared an SSA value, which the pass offset twice), and every copy-engine load's
    box matches its buffer (a host descriptor for q: a 128-row box into a 64-row buffer, the
    hang)."""
    results = [r for r in sm90 if r["kernel"] == "_ws_chunk_kernel"]
    assert results and {r["constexprs"]["HOST_DESC"] for r in results} == {"True", "False"}
    for r in results:
        assert r["warp_specialized"], r
        assert r["ws_rows_problem"] is None, r
        assert not r["tma_box_mismatches"], r


@pytest.mark.slow
@needs_ptxas
def test_decode_walks_compile_for_sm90(sm90):
    """Every walk of the decode split kernel (kernels/paged_decode_walks.py) compiles for sm_90
    with tensor-core dots and no spills, at every group aot_sm90.py builds and over the e4m3
    cache at the 70B's group of 8; there "blocks_t" (the group as the dots' N, 8 wide) issues
    fewer mma instructions than "keys" (the group as M, padded to 16 rows)."""
    decode = [r for r in sm90 if r["kernel"] == "_decode_split_kernel"]
    assert {r["constexprs"]["WALK"] for r in decode} == {"0", "1", "2", "3"}
    for r in decode:
        assert r["mma_sync"] or r["wgmma"], r
        assert not r["spill_stores"], r
    e4m3_70b = {
        r["constexprs"]["WALK"]: r
        for r in decode
        if r["constexprs"]["KV_FP8"] == "True" and r["constexprs"]["GROUP"] == "8"
    }
    assert set(e4m3_70b) == {"0", "1", "2", "3"}
    assert e4m3_70b["2"]["mma_sync"] < e4m3_70b["0"]["mma_sync"]
