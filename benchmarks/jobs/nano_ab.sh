#!/usr/bin/env bash
# One H200, one call (~7 min): `nano` on this tree ($REPEATS timed runs on one engine, the
# roofline from ceilings measured in the same process), then on a base tree ($BASE, e.g. an
# export of the last commit carried as .ab/base) on the same machine, then the GPU tests of the
# engine's fast paths and kernels, and the steps kernel by kernel in both trees
# (benchmarks/decode_breakdown.py; $PARTS: decode by default, gemm,decode,prefill for all).
#   git archive HEAD engine kernels fleetlm benchmarks | tar -x -C .ab/base  (.ab/ excluded)
#   BASE=.ab/base REPEATS=3 bash benchmarks/jobs/nano_ab.sh      (carry .ab; results in $OUT)
set -u
export PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
nvidia-smi -L
nano() {  # nano TREE NAME [ARGS]: the bench in TREE's code, JSON and log under $OUT
  local tree=$1 name=$2; shift 2
  (cd "$tree" && PYTHONPATH=$PWD python3 -m fleetlm.cli bench engine --model llama-3.1-8b \
    --workload nano --detokenize --json "$OUT/nano_$name.json" "$@") > "$OUT/nano_$name.log" 2>&1
  stamp "nano $name rc=$?"; grep -E "all_at_once|roofline" "$OUT/nano_$name.log"
}
nano . new --repeats "${REPEATS:-3}"
[ -n "${BASE:-}" ] && nano "$BASE" base --repeats "${BASE_REPEATS:-${REPEATS:-3}}"
[ -n "${SKIP_TESTS:-}" ] || { stamp "gpu tests"
PYTHONPATH=$PWD timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu_paths.py \
  tests/kernels/test_rotary_store_kv.py tests/kernels/test_paged_decode_attention.py \
  tests/kernels/test_skinny_gemm.py tests/kernels/test_fp8_kv_cache.py > "$OUT/gpu_tests.log" 2>&1
stamp "gpu tests rc=$?"; tail -4 "$OUT/gpu_tests.log"; }
breakdown() {  # breakdown TREE NAME
  stamp "decode breakdown $2"
  (cd "$1" && PYTHONPATH=$PWD python3 -m benchmarks.decode_breakdown --parts "${PARTS:-decode}" \
    --batches "${BATCHES:-32,128,256}" --json "$OUT/decode_breakdown_$2.json") \
    > "$OUT/decode_breakdown_$2.log" 2>&1
  stamp "breakdown $2 rc=$?"
  grep -E "ceilings|step GEMMs|decode B=|prefill [0-9]" "$OUT/decode_breakdown_$2.log"
}
breakdown . new
[ -n "${BASE:-}" ] && [ -z "${SKIP_BASE_BREAKDOWN:-}" ] && breakdown "$BASE" base
