#!/bin/bash
# The GPU calls of session 23 (docs/perf/decode.md, "Session 23"):
#
#   bash scripts/gpu_session23.sh floor   # synthetic batch-1 decode steps that move the step's
#                                         # bytes with its dependencies and no attention math,
#                                         # beside the library's step and dense SDPA (64k, 8k)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
case "${1:?usage: scripts/gpu_session23.sh floor}" in
floor)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    for S in 65536 8192; do
        timeout 280 python scripts/gpu_decode_floor.py --context "$S" 2>&1 | tee "$OUT/decode_floor_$S.txt"
    done
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
