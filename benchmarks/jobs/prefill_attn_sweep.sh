#!/usr/bin/env bash
# One H200: first (cut at 90 s) benchmarks/sweeps/prefill_ws_diagnose.py on the warp-specialized
# kernel (128/128/4/2 ws: the 2026-12-02 run found the second consumer warpgroup on the next
# tile's rows, fixed since; every case must now read ok), then (cut at 60 s) the same on its
# host-descriptor variant (128/128/4/2 tma ws, which hung before q left the host descriptor);
# then every dense prefill attention variant (kernels/dense_prefill_attention.py CONFIGS_TO_SWEEP,
# lazy-rescale ones included, and CONFIGS_WARP_SPEC) on 1 x 8192 causal against the bf16 matmul
# ceiling of the same run (issue 15: >= 70 %), then the default and the fastest on the other
# prefill shapes (benchmarks/sweeps/prefill_sweep.py through benchmarks.kernel_bench). A variant that fails to
# compile, launch or finish is reported and skipped. About 4-6 minutes, at most 90 + 60 + 340 s:
# the diagnostics are cut at 90 and 60 s, the sweep time-boxes its phases (PHASES in
# prefill_sweep.py) and is cut at 340 s.
# Needs torch and triton.
# Run through benchmarks/device_jobs.sh (collect with WAIT_S=560); results land in $JOBS/results:
#   prefill_ws_diagnose.log / .json (NaN, unwritten and wrong rows of the ws kernel by case,
#   variant and stage, with histograms), prefill_ws_kernels/ (the chunk kernels' TTGIR, PTX),
#   prefill_ws_diagnose_tma.log / .json (the same for the host-descriptor variant),
#   prefill_sweep_h200.json (kernel_bench's report; the sweep under "prefill_sweep"),
#   prefill_sweep.log (every row as measured, then the summary), gpu.txt (clocks, power),
#   prefill_sweep_partial.json (rows so far and the one running: kept if the job is cut).
# DIAGNOSE_ARGS: more prefill_ws_diagnose.py arguments (e.g. --config "128/64/4/2");
# SKIP_TMA_DIAGNOSE=1: not the second diagnostic; SKIP_SWEEP=1: the diagnostics only. SWEEP_ARGS: more benchmarks.kernel_bench arguments (--smoke: a CPU
# dry run under TRITON_INTERPRET=1).
set -u
R=${JOBS:-/tmp/fleetlm-jobs}/results
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv > "$R/gpu.txt" 2>&1
PYTHONPATH=$PWD timeout -k 5 90 python3 -m benchmarks.sweeps.prefill_ws_diagnose \
  --json "$R/prefill_ws_diagnose.json" --dump "$R/prefill_ws_kernels" ${DIAGNOSE_ARGS:-} \
  > "$R/prefill_ws_diagnose.log" 2>&1
echo "prefill ws diagnose rc=$?" | tee -a "$R/prefill_ws_diagnose.log"
sed -n '/==== prefill ws diagnose summary/,$p' "$R/prefill_ws_diagnose.log"
if [ "${SKIP_TMA_DIAGNOSE:-0}" != 1 ]; then
  PYTHONPATH=$PWD timeout -k 5 60 python3 -m benchmarks.sweeps.prefill_ws_diagnose \
    --config "128/128/4/2 tma" --budget 52 --json "$R/prefill_ws_diagnose_tma.json" \
    > "$R/prefill_ws_diagnose_tma.log" 2>&1
  echo "prefill ws diagnose (tma) rc=$?" | tee -a "$R/prefill_ws_diagnose_tma.log"
  sed -n '/==== prefill ws diagnose summary/,$p' "$R/prefill_ws_diagnose_tma.log"
fi
[ "${SKIP_SWEEP:-0}" = 1 ] && exit 0
export PREFILL_SWEEP_PARTIAL=$R/prefill_sweep_partial.json
PYTHONPATH=$PWD timeout -k 10 340 python3 -m benchmarks.kernel_bench --only prefill_sweep \
  --json "$R/prefill_sweep_h200.json" ${SWEEP_ARGS:-} > "$R/prefill_sweep.log" 2>&1
rc=$?
echo "prefill sweep rc=$rc" | tee -a "$R/prefill_sweep.log"
sed -n '/==== prefill sweep summary/,$p' "$R/prefill_sweep.log"
exit $rc
