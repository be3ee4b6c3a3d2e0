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
#   bash scripts/gpu_session17.sh tests <rev>   # GPU tests of the changed kernels and paths
#   bash scripts/gpu_session17.sh final <rev>   # the table (PROFILE=h100 or h200), then the tests
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD/scripts PYTEST_PLUGINS=pytest_nsa.plugin PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nsa_out}"
mkdir -p "$OUT"
TESTS="tests/ops/test_compressed_kernel.py tests/ops/test_selected_kernel.py tests/ops/test_nsa_attention_kernel.py
       tests/ops/test_gates_kernel.py"
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
tests)
    timeout 560 python -m pytest -q -n 3 -m "not benchmark" --gpu-profile auto --nsa-report "$OUT" \
        --nsa-report-commit "${2:?tests needs the commit to name the report after}" $TESTS 2>&1 | tail -8
    ;;
final)
    P="${PROFILE:-h100}"
    python -m nsa.bench prefill --profile "$P" --budget 4 --csv "$OUT/prefill_$P.csv" --plot "$OUT/prefill_$P.png" 2>&1 | tail -8
    timeout 400 python -m pytest -q -n 3 -m "not benchmark" --gpu-profile auto --nsa-report "$OUT" \
        --nsa-report-commit "${2:?final needs the commit to name the report after}" $TESTS 2>&1 | tail -8
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
