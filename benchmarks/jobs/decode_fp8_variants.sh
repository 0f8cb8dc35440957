#!/usr/bin/env bash
# One H200 (~4 min, start/collect through benchmarks/device_jobs.sh): issue 35 item 3, the walks
# of the decode kernel's key range (kernels/paged_decode_walks.py) over an e4m3 cache.
#   1. GPU tests of every walk (the walk tests, the decode kernel's, shared-prefix decode's in
#      each walk, the FP8 cache's), seven pytest processes side by side (the compiles are
#      CPU-bound) -> $R/decode_walks_gpu_tests.log;
#   2. the sweep at the 70B's heads (64 query, 8 KV): each walk x widening x cache, the e4m3 tile
#      shipped and 64:4:3, against the bf16 "keys" kernel and the bytes-over-copy-rate floor
#      (benchmarks/sweeps/decode_fp8_sweep.py --walks) -> $R/decode_fp8_variants_70b.{log,json}.
# A walk becomes pda.FP8_WALK when its tests pass and its e4m3 line reads geomean >= 1.15x with
# every shape faster ("meets the FP8_WALK rule" in the log).
#   benchmarks/device_jobs.sh start benchmarks/jobs/decode_fp8_variants.sh; WAIT_S=300 ... collect
. benchmarks/jobs/base.sh
nvidia-smi -L
if [ -z "${SKIP_TESTS:-}" ]; then
  k=tests/kernels
  # one pytest process per part (file, -k expression): the walk tests per walk, the rest
  files=("$k/test_paged_decode_attention_walks.py" "$k/test_paged_decode_attention_walks.py"
         "$k/test_paged_decode_attention_walks.py" "$k/test_paged_decode_attention_walks.py"
         "$k/test_shared_prefix_decode.py" "$k/test_paged_decode_attention.py"
         "$k/test_fp8_kv_cache.py")
  exprs=("keys" "blocks and not blocks_t" "blocks_t and not blocks_ts" "blocks_ts" "" "" "")
  pids=()
  for i in "${!files[@]}"; do
    timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider "${files[$i]}" \
      -k "${exprs[$i]}" > "$R/decode_walks_gpu_tests.$i.log" 2>&1 &
    pids+=($!)
  done
  : > "$R/decode_walks_gpu_tests.log"
  for i in "${!files[@]}"; do
    wait "${pids[$i]}"; rc=$?
    { echo "== ${files[$i]} -k '${exprs[$i]}' rc=$rc"; cat "$R/decode_walks_gpu_tests.$i.log"; } \
      >> "$R/decode_walks_gpu_tests.log"
    rm -f "$R/decode_walks_gpu_tests.$i.log"
    stamp "tests ${files[$i]} -k '${exprs[$i]}' rc=$rc"
  done
  grep -E "^== |passed|failed|^FAILED|^ERROR" "$R/decode_walks_gpu_tests.log" | tail -40
fi
timeout "${SWEEP_S:-200}" python3 -m benchmarks.sweeps.decode_fp8_sweep --heads 64 --kv-heads 8 \
  --shapes "${ATTN_SHAPES:-64:2048,128:2048,256:1024}" --walks "${WALKS:-keys,blocks,blocks_t,blocks_ts}" \
  --widen "${WIDEN:-fp16,q}" --tiles "${TILES:-shipped,64:4:3}" --factors "${FACTORS:-1}" \
  --json "$R/decode_fp8_variants_70b.json" > "$R/decode_fp8_variants_70b.log" 2>&1
stamp "walk sweep rc=$?"
grep -A40 "^walks at" "$R/decode_fp8_variants_70b.log"
grep -E "Error|rel_l2" "$R/decode_fp8_variants_70b.log" | head -10
