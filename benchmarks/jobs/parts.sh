# The parts a session's job runs, one function each (part_NAME), for a job script to call in the
# order its $PARTS names: `. benchmarks/jobs/parts.sh; run_parts "tests structured ..."`.
# Results under $R (common.sh); each part stamps its exit status and prints its headline lines.
. benchmarks/jobs/common.sh

# $SERVE_ENV: extra server settings for the serve parts, e.g. "FLEETLM_STEP_TIME_TARGET_S=0.035".
# bench serve takes --rates comma-separated; "2 4" is taken as "2,4" (a space cost a call once).
rates() { local r=$1; echo "${r// /,}"; }

serve_env_args() { local kv; for kv in ${SERVE_ENV:-}; do printf -- '--server-env %s ' "$kv"; done; }

part_tests() {  # the engine's GPU-path tests and the grammar-mask kernel's
  PYTHONPATH=/tmp/site:$PWD timeout "${TESTS_S:-420}" python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_gpu_paths.py tests/engine/test_overlap_gpu.py tests/engine/test_fp8_tp_gpu.py \
    tests/kernels/test_token_bitmask.py > "$R/gpu_engine_tests.log" 2>&1
  stamp "engine gpu tests rc=$?"; tail -8 "$R/gpu_engine_tests.log"
}

part_tests_calibration() {  # the start-up step-cost calibration on the GPU (before serving on it)
  PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_gpu_paths.py -k "calibrated or compiles" > "$R/gpu_calibration_tests.log" 2>&1
  stamp "calibration gpu tests rc=$?"; tail -6 "$R/gpu_calibration_tests.log"
}

part_structured_engine() {  # issue 38: TPOT with a JSON schema against without (bare engine)
  PYTHONPATH=/tmp/site:$PWD timeout 300 python3 -m benchmarks.structured_output \
    --model llama-3.1-8b --streams 64 --max-tokens 256 > "$R/structured_output_8b.log" 2>&1
  stamp "structured rc=$?"; tail -40 "$R/structured_output_8b.log"
}

part_structured() {  # the above, then the host side alone
  part_structured_engine
  PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m benchmarks.grammar_host \
    --json "$R/grammar_host_h200.json" > "$R/grammar_host.log" 2>&1
  stamp "grammar_host rc=$?"; tail -10 "$R/grammar_host.log"
}

part_serve8() {  # issue 36: the 8B bf16 at 2x its goodput, the brief's TTFT as admission bound
  OUT=$R/serve8 benchmarks/device_serve.sh --launch --model llama-3.1-8b \
    --server-env FLEETLM_MAX_QUEUE_WAIT_S=0.8 $(serve_env_args) --rates "$(rates "${RATES8:-24}")" --duration 120 \
    --no-stop-on-miss --json "$R/serve8/serve.json" > "$R/serve8.log" 2>&1
  stamp "serve8 rc=$?"; grep -E "req/s|goodput|forecast|predicted|refused|503|slowest" "$R/serve8/bench.log" | tail -12
}

part_serve70() {  # issues 35/36: the 70B FP8 with an e4m3 KV cache, same bound
  serve70_as serve70
}

part_serve70_shared() {  # issue 35 item 4: the same with shared-prefix decode attention
  SERVE_ENV="${SERVE_ENV:-} FLEETLM_SHARED_PREFIX_DECODE=true" serve70_as serve70_shared
}

serve70_as() {  # results under $R/$1
  OUT=$R/$1 benchmarks/device_serve.sh --launch --model llama-3.1-70b \
    --server-env FLEETLM_QUANTIZATION=fp8 --server-env FLEETLM_KV_CACHE_DTYPE=fp8 \
    --server-env FLEETLM_MAX_QUEUE_WAIT_S=0.8 $(serve_env_args) --rates "$(rates "${RATES70:-3}")" --duration 120 \
    --no-stop-on-miss --json "$R/$1/serve.json" > "$R/$1.log" 2>&1
  stamp "$1 rc=$?"; grep -E "req/s|goodput|forecast|predicted|refused|503|slowest" "$R/$1/bench.log" | tail -20
}

part_serve70_goodput() {  # issue 35: the 70B FP8 at rates around the forecasts, no
  # admission bound (refusals would count as misses), 120 s per rate (GOODPUT70_S), results
  # under $R/${SERVE70_NAME:-serve70_goodput}
  local name=${SERVE70_NAME:-serve70_goodput}
  OUT=$R/$name benchmarks/device_serve.sh --launch --model llama-3.1-70b \
    --server-env FLEETLM_QUANTIZATION=fp8 --server-env FLEETLM_KV_CACHE_DTYPE=fp8 \
    $(serve_env_args) --rates "$(rates "${GOODPUT70:-0.7 1}")" --duration "${GOODPUT70_S:-120}" --no-stop-on-miss \
    --json "$R/$name/serve.json" > "$R/$name.log" 2>&1
  stamp "$name rc=$?"; grep -E "req/s|goodput|refused|503" "$R/$name/bench.log" | tail -12
}

part_serve8_goodput() {  # issues 35/36: the 8B bf16 at rates around its goodput, no admission
  # bound, 120 s per rate (GOODPUT8, GOODPUT8_S), results under $R/${SERVE8_NAME:-serve8_goodput}
  local name=${SERVE8_NAME:-serve8_goodput}
  OUT=$R/$name benchmarks/device_serve.sh --launch --model llama-3.1-8b \
    $(serve_env_args) --rates "$(rates "${GOODPUT8:-12 14}")" --duration "${GOODPUT8_S:-120}" \
    --no-stop-on-miss --json "$R/$name/serve.json" > "$R/$name.log" 2>&1
  stamp "$name rc=$?"; grep -E "req/s|goodput|refused|503" "$R/$name/bench.log" | tail -12
}

part_breakdown() {  # the 70B FP8 decode step kernel by kernel at the defaults
  PYTHONPATH=$PWD timeout 300 python3 -m benchmarks.decode_breakdown --model llama-3.1-70b \
    --quantization fp8 --kv-cache-dtype fp8 --parts decode --batches "${BATCHES:-64}" --context 2000 \
    --steps 10 --json "$R/decode_breakdown_70b_fp8_default.json" \
    > "$R/decode_breakdown_70b_fp8_default.log" 2>&1
  stamp "breakdown rc=$?"; grep -E "decode B=|ms  x" "$R/decode_breakdown_70b_fp8_default.log" | head -12
}

part_breakdown_prefill() {  # issue 35 item 6: the 70B FP8's prefill steps kernel by kernel (a
  # served prompt token cost 0.205 ms on 2026-12-05: 48 % of the e4m3 matmul ceiling)
  PYTHONPATH=$PWD timeout 300 python3 -m benchmarks.decode_breakdown --model llama-3.1-70b \
    --quantization fp8 --kv-cache-dtype fp8 --parts prefill --prefill-tokens 512,2048,4096 \
    --json "$R/prefill_breakdown_70b_fp8.json" > "$R/prefill_breakdown_70b_fp8.log" 2>&1
  stamp "prefill breakdown rc=$?"; grep -E "prefill|ms  x" "$R/prefill_breakdown_70b_fp8.log" | head -20
}

part_kernels() {  # every kernel test compiled on the GPU
  PYTHONPATH=/tmp/site:$PWD timeout 600 python3 -m pytest -q -p no:cacheprovider tests/kernels \
    > "$R/gpu_kernel_tests.log" 2>&1
  stamp "kernel gpu tests rc=$?"; tail -8 "$R/gpu_kernel_tests.log"
}

run_parts() {
  nvidia-smi -L
  for part in $1; do stamp "part $part"; "part_$part"; done
}
