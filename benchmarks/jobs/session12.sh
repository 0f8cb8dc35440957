#!/usr/bin/env bash
# One H200, one job across consecutive device calls (benchmarks/device_jobs.sh start/collect):
#   1. the engine's GPU-path tests (never run since the shared-prefix, structured-output and FP8
#      merges): tests/engine/*gpu*.py;
#   2. the 70B FP8 (e4m3 KV) served on `seed` at 1.5 and 3 req/s, 120 s of arrivals each, with the
#      brief's TTFT bound as the admission bound (FLEETLM_MAX_QUEUE_WAIT_S=0.8): the goodput sweep
#      of issue 35 and, at 3 req/s (≈ 2× the forecast goodput), the overload run of issue 36;
#   3. the 70B FP8 decode step kernel by kernel with the activation quantization fused into
#      rms_norm / silu_mul and without (--unfused-fp8-quant), 64 rows at 2k context;
#   4. structured outputs on the 8B, 64 streams with and without a JSON schema;
#   5. the 8B bf16 served at 24 req/s (2× its measured goodput), 120 s, the same admission bound:
#      issue 36's other overload run;
#   6. every kernel test compiled on the GPU.
# $SKIP: parts to leave out by name (tests serve70 fused structured serve8 kernels).
. benchmarks/jobs/common.sh
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }
nvidia-smi -L
if want tests; then
  PYTHONPATH=/tmp/site:$PWD timeout 420 python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_gpu_paths.py tests/engine/test_overlap_gpu.py tests/engine/test_fp8_tp_gpu.py \
    > "$R/gpu_engine_tests.log" 2>&1
  stamp "engine gpu tests rc=$?"; tail -8 "$R/gpu_engine_tests.log"
fi
if want serve70; then
  OUT=$R/serve70 benchmarks/device_serve.sh --launch --model llama-3.1-70b \
    --server-env FLEETLM_QUANTIZATION=fp8 --server-env FLEETLM_KV_CACHE_DTYPE=fp8 \
    --server-env FLEETLM_MAX_QUEUE_WAIT_S=0.8 --rates "${RATES70:-1.5,3}" --duration 120 \
    --no-stop-on-miss --json "$R/serve70/serve.json" > "$R/serve70.log" 2>&1
  stamp "serve70 rc=$?"; grep -E "req/s|goodput|forecast|refused|503" "$R/serve70/bench.log" | tail -20
fi
if want fused; then  # the FP8 activation quantization fused into rms_norm / silu_mul, A/B
  for mode in fused unfused; do
    flag=""; [ "$mode" = unfused ] && flag="--unfused-fp8-quant"
    PYTHONPATH=$PWD timeout 300 python3 -m benchmarks.decode_breakdown --model llama-3.1-70b \
      --quantization fp8 --kv-cache-dtype fp8 --parts decode $flag --batches 64 --context 2000 \
      --steps 10 --json "$R/decode_breakdown_70b_fp8_$mode.json" \
      > "$R/decode_breakdown_70b_fp8_$mode.log" 2>&1
    stamp "breakdown $mode rc=$?"; grep -E "decode B=|ms  x" "$R/decode_breakdown_70b_fp8_$mode.log" | head -12
  done
fi
if want structured; then  # issue 38: TPOT with a JSON schema against without, overlapped
  PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m benchmarks.structured_output \
    --model llama-3.1-8b --streams 64 --max-tokens 256 \
    > "$R/structured_output_8b.log" 2>&1
  stamp "structured rc=$?"; tail -12 "$R/structured_output_8b.log"
fi
if want serve8; then
  OUT=$R/serve8 benchmarks/device_serve.sh --launch --model llama-3.1-8b \
    --server-env FLEETLM_MAX_QUEUE_WAIT_S=0.8 --rates 24 --duration 120 \
    --no-stop-on-miss --json "$R/serve8/serve.json" > "$R/serve8.log" 2>&1
  stamp "serve8 rc=$?"; grep -E "req/s|goodput|forecast|refused|503" "$R/serve8/bench.log" | tail -12
fi
if want kernels; then
  PYTHONPATH=/tmp/site:$PWD timeout 600 python3 -m pytest -q -p no:cacheprovider tests/kernels \
    > "$R/gpu_kernel_tests.log" 2>&1
  stamp "kernel gpu tests rc=$?"; tail -8 "$R/gpu_kernel_tests.log"
fi
