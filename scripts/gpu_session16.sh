#!/bin/bash
# The GPU calls of session 16 (docs/perf/prefill.md, "Session 16"), one step per call:
#
#   git archive 8927177 src | (mkdir -p ab_base && tar -x -C ab_base)   # session 15's code
#   bash scripts/gpu_session16.sh ab            # whole prefill, session 15's code against this
#                                               # checkout's, twice each in turn, then every
#                                               # kernel's time in one forward+backward
#   bash scripts/gpu_session16.sh tests <rev>   # as in gpu_session15.sh
#   bash scripts/gpu_session16.sh final <rev>   # as in gpu_session15.sh (PROFILE=h100 or h200)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD/scripts PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nsa_out}"
mkdir -p "$OUT"
case "${1:?usage: scripts/gpu_session16.sh ab|tests REV|final REV}" in
ab)
    bash scripts/gpu_ab_prefill.sh ab_base "${LENGTHS:-8192,65536}" 2 2>&1 | grep -v "^batch\|^    1 " | tee "$OUT/ab.txt"
    python scripts/gpu_prefill_probe.py --only kernels --lengths 8192 65536 2>&1 | tee "$OUT/probe.txt"
    ;;
tests | final)
    exec bash scripts/gpu_session15.sh "$@"
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
