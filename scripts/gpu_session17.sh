#!/bin/bash
# The GPU calls of session 17 (docs/perf/prefill.md, "Session 17"), one step per call:
#
#   git archive 96e040f src | (mkdir -p ab_base && tar -x -C ab_base)   # session 16's code
#   bash scripts/gpu_session17.sh ab            # whole prefill, session 16's code against this
#                                               # checkout's, twice each in turn, then every
#                                               # kernel's time in one forward+backward
#   bash scripts/gpu_session17.sh ds            # the selected dQ from the dK/dV kernel's dS (probe
#                                               # section dq_ds), then the whole prefill at 8k against
#                                               # session 16's code and the kernels of one step
#   bash scripts/gpu_session17.sh tests <rev>   # as in gpu_session15.sh, on the compressed, selected,
#   bash scripts/gpu_session17.sh final <rev>   # gates and whole-op kernel tests
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
case "${1:?usage: scripts/gpu_session17.sh ab|ds|tests REV|final REV}" in
ab)
    bash scripts/gpu_ab_prefill.sh ab_base "${LENGTHS:-8192,65536}" 2 2>&1 | grep -v "^batch\|^    1 " | tee "$OUT/ab.txt"
    python scripts/gpu_prefill_probe.py --only kernels --lengths 8192 65536 2>&1 | tee "$OUT/probe.txt"
    ;;
ds)
    python scripts/gpu_prefill_probe.py --only dq_ds --lengths 8192 65536 2>&1 | tee "$OUT/dq_ds.txt"
    bash scripts/gpu_ab_prefill.sh ab_base "${LENGTHS:-8192}" 2 2>&1 | grep -v "^batch\|^    1 " | tee "$OUT/ab.txt"
    python scripts/gpu_prefill_probe.py --only kernels --lengths 8192 2>&1 | tee "$OUT/probe.txt"
    ;;
tests | final)
    TESTS="tests/ops/test_compressed_kernel.py tests/ops/test_selected_kernel.py tests/ops/test_nsa_attention_kernel.py
           tests/ops/test_gates_kernel.py" exec bash scripts/gpu_session15.sh "$@"
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
