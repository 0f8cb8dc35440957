#!/usr/bin/env bash
# One H200, the one-GPU figures of a session in one job, most wanted first:
#   1. the served path and the bare engine on `seed` at $RATES (default 12 req/s, 60 s of
#      arrivals, identical requests, --compare-engine);
#   2. the bare engine on the same requests with FP8 weights, then FP8 weights + FP8 KV
#      ($FP8_CONFIGS; the bf16 engine of part 1 is the baseline);
#   3. the engine on `nano` (256 at once, detokenized);
#   4. the GPU tests of the engine's paths and of FP8 (cut at 240 s), the FP8 kernels.
# $SKIP: parts to leave out, by name (fp8 nano tests kernels), e.g. SKIP="fp8 tests kernels".
# Run through benchmarks/device_jobs.sh; results in $JOBS/results, one log per part.
. benchmarks/jobs/common.sh
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }
nvidia-smi -L
stamp "seed, served and engine at ${RATES:-12}"
OUT=$R/serve benchmarks/device_serve.sh --launch --compare-engine --rates "${RATES:-12}" \
  --model llama-3.1-8b --duration 60 --no-stop-on-miss --json "$R/serve/serve.json" \
  > "$R/serve.log" 2>&1
stamp "served rc=$?"; grep -E "req/s:|goodput|roofline|server side" "$R/serve/bench.log" | tail -12
FP8_DEFAULT="fp8 FLEETLM_QUANTIZATION=fp8;fp8kv FLEETLM_QUANTIZATION=fp8 FLEETLM_KV_CACHE_DTYPE=fp8"
want fp8 && engine_configs "${FP8_CONFIGS:-$FP8_DEFAULT}"
if want nano; then
stamp "nano"
PYTHONPATH=$PWD python3 -m fleetlm.cli bench engine --model llama-3.1-8b --workload nano \
  --detokenize --json "$R/nano.json" > "$R/nano.log" 2>&1
stamp "nano rc=$?"; tail -6 "$R/nano.log"
fi
if want tests; then
stamp "gpu tests"
PYTHONPATH=/tmp/site:$PWD timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/engine/test_fp8_tp_gpu.py tests/kernels/test_fp8_quant.py \
  tests/kernels/test_fp8_kv_cache.py tests/engine/test_gpu_paths.py > "$R/gpu_tests.log" 2>&1
stamp "gpu tests rc=$?"; tail -4 "$R/gpu_tests.log"
fi
want kernels || exit 0
stamp "fp8 kernels"
PYTHONPATH=$PWD timeout 120 python3 -m benchmarks.kernel_bench --only fp8,decode \
  --json "$R/kernels_fp8.json" > "$R/kernels_fp8.log" 2>&1
stamp "kernels rc=$?"; tail -12 "$R/kernels_fp8.log"
