#!/usr/bin/env bash
# One H200, the one-GPU figures of a session in one job, most wanted first: the engine's GPU tests
# (FP8 included), the served path and the bare engine on `seed` at $RATES (default 12 req/s, 60 s
# of arrivals), the engine on `nano` (256 at once, detokenized), the FP8 kernels, then the 8B in
# bf16 and FP8 on `seed` at $RATES_8B. Run through benchmarks/device_jobs.sh; results in
# $JOBS/results, one log per part.
set -u
R=$JOBS/results
mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
stamp "gpu tests"
PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu_paths.py \
  tests/engine/test_overlap_gpu.py tests/engine/test_fp8_tp_gpu.py > "$R/gpu_tests.log" 2>&1
stamp "gpu tests rc=$?"; tail -3 "$R/gpu_tests.log"
stamp "seed, served and engine"
OUT=$R/serve benchmarks/device_serve.sh --launch --compare-engine --rates "${RATES:-12}" \
  --model llama-3.1-8b --duration 60 --no-stop-on-miss --json "$R/serve/serve.json" \
  > "$R/serve.log" 2>&1
stamp "served rc=$?"; grep -E "req/s:|goodput|roofline" "$R/serve/bench.log" | tail -8
stamp "nano"
PYTHONPATH=$PWD python3 -m fleetlm.cli bench engine --model llama-3.1-8b --workload nano \
  --detokenize --json "$R/nano.json" > "$R/nano.log" 2>&1
stamp "nano rc=$?"; tail -4 "$R/nano.log"
stamp "fp8 kernels, 8B bf16 vs fp8"
PYTHONPATH=$PWD python3 benchmarks/fp8_tp_bench.py --out "$R/fp8" --parts plan,kernels,engine8b \
  --configs-8b bf16,fp8 --rates-8b "${RATES_8B:-12,16}" > "$R/fp8.log" 2>&1
stamp "fp8 rc=$?"; tail -8 "$R/fp8.log"
