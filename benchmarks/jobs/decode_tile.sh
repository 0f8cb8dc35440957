#!/usr/bin/env bash
# One H200, one call (~4 min): the bf16 decode tile sweep (benchmarks/sweeps/decode_tile_sweep.py), then
# `nano` once with the default tile and once with the sweep's best for nano's shapes (the
# kernel's module constants set before the engine starts; the engine itself never reads them
# from anywhere else).
set -u
export PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%H:%M:%S)] $*"; }
PYTHONPATH=$PWD timeout 120 python3 -m benchmarks.sweeps.decode_tile_sweep --json "$OUT/decode_tile_sweep.json" \
  --best-to "$OUT/best_tile.txt" > "$OUT/decode_tile_sweep.log" 2>&1
stamp "sweep rc=$?"; cat "$OUT/decode_tile_sweep.log"
best=$(cat "$OUT/best_tile.txt" 2>/dev/null || echo "64 4 3")
{ [ "$best" = "64 4 3" ] || [ -n "${SWEEP_ONLY:-}" ]; } && exit 0
for tile in "$best" "64 4 3"; do
  name=$(echo $tile | tr ' ' x)
  PYTHONPATH=$PWD timeout 130 python3 -c "
import sys
from kernels import paged_decode_attention as pda
pda.BLOCK_N_DEFAULT, pda.NUM_WARPS, pda.NUM_STAGES = map(int, sys.argv[1].split())
from fleetlm.cli import main
sys.exit(main(['bench', 'engine', '--model', 'llama-3.1-8b', '--workload', 'nano', '--detokenize',
               '--json', sys.argv[2]]))" "$tile" "$OUT/nano_tile_$name.json" > "$OUT/nano_tile_$name.log" 2>&1
  stamp "nano tile $tile rc=$?"; grep -E "all_at_once|roofline" "$OUT/nano_tile_$name.log"
done
