#!/usr/bin/env bash
# One H200: every dense prefill attention variant (kernels/dense_prefill_attention.py
# CONFIGS_TO_SWEEP and CONFIGS_WARP_SPEC) on 1 x 8192 causal against the bf16 matmul ceiling of
# the same run (issue 15: >= 70 %), then the default and the fastest on the other prefill shapes
# (benchmarks/prefill_sweep.py through kernel_bench.py). A variant that fails to compile, launch
# or finish is reported and skipped. About 2-4 minutes: the sweep time-boxes its phases (PHASES
# in prefill_sweep.py) and the job is cut at 340 s, inside 6 minutes. Needs torch and triton.
# Run through benchmarks/device_jobs.sh; results land in $JOBS/results:
#   prefill_sweep_h200.json (kernel_bench's report; the sweep under "prefill_sweep"),
#   prefill_sweep.log (every row as measured, then the summary), gpu.txt (clocks, power),
#   prefill_sweep_partial.json (rows so far and the one running: kept if the job is cut).
# SWEEP_ARGS: more kernel_bench.py arguments (--smoke: a CPU dry run under TRITON_INTERPRET=1).
set -u
R=${JOBS:-/tmp/fleetlm-jobs}/results
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv > "$R/gpu.txt" 2>&1
export PREFILL_SWEEP_PARTIAL=$R/prefill_sweep_partial.json
PYTHONPATH=$PWD timeout -k 10 340 python3 benchmarks/kernel_bench.py --only prefill_sweep \
  --json "$R/prefill_sweep_h200.json" ${SWEEP_ARGS:-} > "$R/prefill_sweep.log" 2>&1
rc=$?
echo "prefill sweep rc=$rc" | tee -a "$R/prefill_sweep.log"
sed -n '/==== prefill sweep summary/,$p' "$R/prefill_sweep.log"
exit $rc
