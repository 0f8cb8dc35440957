#!/usr/bin/env bash
# One H200: the engine's GPU tests, the host cost of a mixed step (profile_step.py --mixed), then
# the served path and the bare engine on `seed` at $RATES (default 10,12,14 req/s, 60 s of
# arrivals each) with whatever FLEETLM_* settings were exported. SKIP_CHECKS=1 runs only the sweep.
# Run through benchmarks/device_jobs.sh; results land in $JOBS/results.
. benchmarks/jobs/common.sh
if [ -z "${SKIP_CHECKS:-}" ]; then
PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu_paths.py \
  tests/engine/test_overlap_gpu.py tests/engine/test_prefill_order.py ${GPU_TESTS:-} \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$R/gpu_tests.log"
PYTHONPATH=$PWD python3 -m benchmarks.profile_step --seqs 96 --mixed "${MIXED:-512}" --steps 60 \
  > "$R/profile_mixed.log" 2>&1
echo "profile rc=$?" | tee -a "$R/profile_mixed.log"
fi
OUT=$R/serve benchmarks/device_serve.sh --launch --compare-engine --rates "${RATES:-10,12,14}" \
  --model llama-3.1-8b --duration 60 --no-stop-on-miss --json "$R/serve/serve.json"
echo "served rc=$?"
