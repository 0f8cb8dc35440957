#!/usr/bin/env bash
# One H200 (~9 min, start/collect through benchmarks/device_jobs.sh): the 70B's FP8 decode path.
#   1. kernels/skinny_gemm.py's tests compiled on the GPU (the e4m3 weight forms among them);
#   2. the skinny GEMM's e4m3 sweep at llama-3.1-70b's projections against the activation
#      quantization + torch._scaled_mm (benchmarks/sweeps/skinny_gemm_sweep.py --fp8);
#   3. the 70B FP8 decode step kernel by kernel against its bandwidth floor
#      (benchmarks/decode_breakdown.py, e4m3 weights and KV cache, ~2k context).
#   benchmarks/device_jobs.sh start benchmarks/jobs/fp8_decode.sh; WAIT_S=500 ... collect
set -u
R=$JOBS/results
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
GRID_DEFAULT='{"split": [1, 2, 4], "stages": [4]}'
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi -L
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_skinny_gemm.py \
  > "$R/skinny_tests.log" 2>&1
stamp "tests rc=$?"; tail -3 "$R/skinny_tests.log"
timeout "${SWEEP_S:-330}" python3 -m benchmarks.sweeps.skinny_gemm_sweep --model llama-3.1-70b --fp8 \
  --ms "${MS:-1,32,64,128,256}" --shapes "${SHAPES:-qkv,o,gate_up,down}" \
  --grid "${GRID:-$GRID_DEFAULT}" \
  --json "$R/skinny_fp8_sweep_70b.json" > "$R/skinny_fp8_sweep_70b.log" 2>&1
stamp "sweep rc=$?"; grep -vE "^\s*$" "$R/skinny_fp8_sweep_70b.log" | tail -30
timeout "${BREAKDOWN_S:-400}" python3 -m benchmarks.decode_breakdown --model llama-3.1-70b \
  --quantization fp8 --kv-cache-dtype fp8 --parts "${PARTS:-decode}" \
  --batches "${BATCHES:-64,128}" --context "${CONTEXT:-2000}" --steps 10 \
  --json "$R/decode_breakdown_70b_fp8.json" > "$R/decode_breakdown_70b_fp8.log" 2>&1
stamp "breakdown rc=$?"
grep -E "ceilings|decode B=|prefill [0-9]|ms  x" "$R/decode_breakdown_70b_fp8.log" | head -40
