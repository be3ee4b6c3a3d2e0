#!/bin/bash
# The GPU calls of session 19 (docs/perf/prefill.md, "Session 19"), one step per call:
#
#   git archive <rev> src | (mkdir -p ab_base && tar -x -C ab_base)   # the code before the change
#   bash scripts/gpu_session19.sh probe         # the compressed backward with its dQ from dS against
#                                               # the dQ recomputing, by the dQ's tiles, at 8k, 16k
#                                               # and 64k (probe section cmp_dq_ds); then the whole
#                                               # prefill, that code against this checkout's, twice
#                                               # each in turn; the kernels of one 8k step
#   bash scripts/gpu_session19.sh tests <rev>   # the compressed, whole-op and selected kernel tests
#   bash scripts/gpu_session19.sh final <rev>   # the table (PROFILE=h100 or h200), then those tests
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
TESTS="${TESTS:-tests/ops/test_compressed_kernel.py tests/ops/test_nsa_attention_kernel.py tests/ops/test_selected_kernel.py}"
case "${1:?usage: scripts/gpu_session19.sh probe|tests REV|final REV}" in
probe)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_prefill_probe.py --only cmp_dq_ds --lengths ${PROBE_LENGTHS:-8192 16384 65536} 2>&1 \
        | tee "$OUT/cmp_dq_ds.txt"
    bash scripts/gpu_ab_prefill.sh ab_base "${LENGTHS:-8192,65536}" 2 2>&1 | grep -v "^batch\|^    1 \|^routes" \
        | tee "$OUT/ab.txt"
    python scripts/gpu_prefill_probe.py --only kernels --lengths 8192 2>&1 | tee "$OUT/kernels.txt"
    ;;
tests | final)
    TESTS="$TESTS" exec bash scripts/gpu_session15.sh "$@"
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
