#!/usr/bin/env bash
# One H200, one call (~3 min): the decode kernel's split counts at serving shapes
# (benchmarks/sweeps/decode_split_sweep.py: every count, the rule's pick and the rule before it's).
# Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi -L
python3 -m benchmarks.sweeps.decode_split_sweep --json "$OUT/decode_split_sweep.json" \
  > "$OUT/decode_split_sweep.log" 2>&1
echo "sweep rc=$?"; grep -E "^B=|sum over|Error" "$OUT/decode_split_sweep.log" | tail -70
