#!/usr/bin/env bash
# One H200, one job across consecutive device calls (benchmarks/device_jobs.sh start/collect),
# in the order of what the last CPU-only session left unmeasured:
#   1. the engine's GPU-path tests (not run since the shared-prefix, structured-output and FP8
#      merges) and the grammar-mask kernel's test: tests/engine/*gpu*.py, test_token_bitmask;
#   2. structured outputs on the 8B, 64 streams with and without a JSON schema (issue 38's
#      TPOT ratio, with the step-trace split: read_ahead / masks / GPU gap), then the host side
#      alone (benchmarks.grammar_host: whether llguidance's pool runs in parallel on this host);
#   3. the 8B bf16 served at 24 req/s (2× its goodput) and the 70B FP8 (e4m3 KV) at 3 req/s,
#      120 s each, admission bound 0.8 s: issue 36's overload runs with the prefill-aware
#      forecast (serve.json reports predicted_ttft_s against the measured first token);
#   4. the 70B FP8 decode step kernel by kernel at the default (norm quantization fused);
#   5. every kernel test compiled on the GPU.
# $SKIP: parts to leave out by name (tests structured serve8 serve70 breakdown kernels).
. benchmarks/jobs/common.sh
want() { [[ " ${SKIP:-} " != *" $1 "* ]]; }
nvidia-smi -L
if want tests; then
  PYTHONPATH=/tmp/site:$PWD timeout 480 python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_gpu_paths.py tests/engine/test_overlap_gpu.py tests/engine/test_fp8_tp_gpu.py \
    tests/kernels/test_token_bitmask.py > "$R/gpu_engine_tests.log" 2>&1
  stamp "engine gpu tests rc=$?"; tail -8 "$R/gpu_engine_tests.log"
fi
if want structured; then
  PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m benchmarks.structured_output \
    --model llama-3.1-8b --streams 64 --max-tokens 256 > "$R/structured_output_8b.log" 2>&1
  stamp "structured rc=$?"; tail -14 "$R/structured_output_8b.log"
  PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m benchmarks.grammar_host \
    --json "$R/grammar_host_h200.json" > "$R/grammar_host.log" 2>&1
  stamp "grammar_host rc=$?"; tail -10 "$R/grammar_host.log"
fi
if want serve8; then
  OUT=$R/serve8 benchmarks/device_serve.sh --launch --model llama-3.1-8b \
    --server-env FLEETLM_MAX_QUEUE_WAIT_S=0.8 --rates 24 --duration 120 \
    --no-stop-on-miss --json "$R/serve8/serve.json" > "$R/serve8.log" 2>&1
  stamp "serve8 rc=$?"; grep -E "req/s|goodput|forecast|predicted|refused|503" "$R/serve8/bench.log" | tail -12
fi
if want serve70; then
  OUT=$R/serve70 benchmarks/device_serve.sh --launch --model llama-3.1-70b \
    --server-env FLEETLM_QUANTIZATION=fp8 --server-env FLEETLM_KV_CACHE_DTYPE=fp8 \
    --server-env FLEETLM_MAX_QUEUE_WAIT_S=0.8 --rates "${RATES70:-3}" --duration 120 \
    --no-stop-on-miss --json "$R/serve70/serve.json" > "$R/serve70.log" 2>&1
  stamp "serve70 rc=$?"; grep -E "req/s|goodput|forecast|predicted|refused|503" "$R/serve70/bench.log" | tail -20
fi
if want breakdown; then
  PYTHONPATH=$PWD timeout 300 python3 -m benchmarks.decode_breakdown --model llama-3.1-70b \
    --quantization fp8 --kv-cache-dtype fp8 --parts decode --batches 64 --context 2000 \
    --steps 10 --json "$R/decode_breakdown_70b_fp8_default.json" \
    > "$R/decode_breakdown_70b_fp8_default.log" 2>&1
  stamp "breakdown rc=$?"; grep -E "decode B=|ms  x" "$R/decode_breakdown_70b_fp8_default.log" | head -12
fi
if want kernels; then
  PYTHONPATH=/tmp/site:$PWD timeout 600 python3 -m pytest -q -p no:cacheprovider tests/kernels \
    > "$R/gpu_kernel_tests.log" 2>&1
  stamp "kernel gpu tests rc=$?"; tail -8 "$R/gpu_kernel_tests.log"
fi
