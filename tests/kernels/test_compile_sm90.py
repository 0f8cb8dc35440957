# The kernels must compile for Hopper (sm_90) even though the other tests run them in the CPU
# interpreter. See aot_sm90.py; it runs in a subprocess without TRITON_INTERPRET.
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.dense_prefill_attention import CONFIG_16BIT

ROOT = Path(__file__).resolve().parents[2]


def _nvidia_backend_available() -> bool:
    try:
        import triton

        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        return ptxas.exists() or os.environ.get("TRITON_PTXAS_PATH") is not None
    except ImportError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(
    not _nvidia_backend_available(), reason="triton's NVIDIA backend (ptxas) is not installed"
)
def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.aot_sm90"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) >= 10
    for r in results:
        assert r["cubin"], r
        assert r["smem_ok"], r
    # tensor-core dots: mma.sync for the decode group (M = 16), wgmma for 128-row prefill tiles
    names = {r["kernel"] for r in results}
    assert {"_decode_split_kernel", "_prefill_kernel", "_store_kv_kernel"} <= names
    assert "_dense_prefill_kernel" in names
    # the dense prefill path's TMA configs load K/V through the copy engine
    assert any(r["tma_loads"] for r in results if r["kernel"] == "_dense_prefill_kernel")
    # the warp-specialized variant compiles (Triton 3.6's Hopper pass), copy engine throughout
    ws = [r for r in results if r["kernel"] == "_ws_chunk_kernel"]
    assert ws and all(r["tma_loads"] and not r["wgmma_serialized"] for r in ws), ws
    # the default dense config keeps its wgmma chains asynchronous (no ptxas C751x note)
    cfg = CONFIG_16BIT
    default = [
        r for r in results
        if r["kernel"] == "_dense_prefill_kernel" and r["constexprs"]["HEAD_DIM"] == "128"
        and (r["constexprs"]["BLOCK_M"], r["constexprs"]["BLOCK_N"]) == (str(cfg[0]), str(cfg[1]))
        and (r["num_warps"], r["num_stages"]) == (cfg.num_warps, cfg.num_stages)
    ]  # fmt: skip
    assert default and not any(r["wgmma_serialized"] for r in default), default
