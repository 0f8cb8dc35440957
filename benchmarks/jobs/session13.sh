#!/usr/bin/env bash
# One H200, one job across consecutive device calls (benchmarks/device_jobs.sh start/collect):
# the parts of benchmarks/jobs/parts.sh in the order $PARTS names (default: all, in the order of
# what the CPU-only sessions left unmeasured):
#   tests       the engine's GPU-path tests and the grammar-mask kernel's test;
#   structured  the 8B, 64 streams with and without a JSON schema (issue 38), then the host alone;
#   serve8      the 8B bf16 served at 24 req/s (2x goodput), 120 s, admission bound 0.8 s (36);
#   serve70     the 70B FP8 (e4m3 KV) served at $RATES70 (3) req/s, same bound (35, 36);
#   breakdown   the 70B FP8 decode step kernel by kernel at the defaults;
#   kernels     every kernel test compiled on the GPU.
. benchmarks/jobs/parts.sh
run_parts "${PARTS:-tests structured serve8 serve70 breakdown kernels}"
