#!/usr/bin/env bash
# One H200: the e4m3 decode tile sweep (benchmarks/sweeps/decode_fp8_sweep.py), then the bare engine with
# FP8 weights + FP8 KV on `seed` at $RATES (default 12 req/s, 60 s of arrivals; the same requests
# as one_gpu_round.sh) with the sweep's best tile set before the engine captures its graphs.
# Run through benchmarks/device_jobs.sh; results in $JOBS/results.
. benchmarks/jobs/common.sh
stamp "sweep"
PYTHONPATH=$PWD python3 -m benchmarks.sweeps.decode_fp8_sweep --json "$R/decode_fp8_sweep.json" \
  > "$R/decode_fp8_sweep.log" 2>&1
stamp "sweep rc=$?"; tail -7 "$R/decode_fp8_sweep.log"
tile=$(python3 -c "import json; print(','.join(map(str, json.load(open('$R/decode_fp8_sweep.json'))['best_tile'])))") || exit 1
stamp "engine fp8 + fp8 KV, tile ($tile)"
FLEETLM_QUANTIZATION=fp8 FLEETLM_KV_CACHE_DTYPE=fp8 PYTHONPATH=/tmp/site:$PWD python3 -c "
import sys
import kernels.paged_decode_attention as pda
pda.FP8_LAUNCH = ($tile)
from fleetlm.cli import main
sys.exit(main(sys.argv[1:]))
" bench serve --backend engine --model llama-3.1-8b --rates "${RATES:-12}" --duration 60 \
  --no-stop-on-miss --json "$R/engine_fp8kv_tile.json" > "$R/engine_fp8kv_tile.log" 2>&1
stamp "engine rc=$?"; grep -E "req/s:|goodput|roofline" "$R/engine_fp8kv_tile.log" | tail -4
