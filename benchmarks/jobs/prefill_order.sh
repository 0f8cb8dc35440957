#!/usr/bin/env bash
# One H200: the prefill order (short prompts before long documents, scheduler.py) on `seed`.
# The served path and the bare engine with it on at $RATES (default 8,10,12), then the bare
# engine with it off at $OFF_RATES (default 8,10): the before/after of the change.
# Run through benchmarks/device_jobs.sh; results land in $JOBS/results.
. benchmarks/jobs/common.sh
PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -p no:cacheprovider \
  tests/engine/test_gpu_paths.py tests/engine/test_prefill_order.py ${GPU_TESTS:-} \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$R/gpu_tests.log"
OUT=$R/serve benchmarks/device_serve.sh --launch --compare-engine --rates "${RATES:-8,10,12}" \
  --model llama-3.1-8b --duration 60 --no-stop-on-miss --json "$R/serve/serve.json" \
  --plot "$R/serve/serve.png"
echo "served rc=$?"
OUT=$R/off benchmarks/device_serve.sh --backend engine --rates "${OFF_RATES:-8,10}" \
  --model llama-3.1-8b --duration 60 --no-stop-on-miss --json "$R/off/engine_off.json" \
  --server-env FLEETLM_SHORT_PREFILL_FIRST=false
echo "engine off rc=$?"
