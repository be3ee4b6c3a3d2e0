#!/bin/bash
# The GPU calls of session 18 (docs/perf/prefill.md, "Session 18"), one step per call:
#
#   git archive <rev> src | (mkdir -p ab_base && tar -x -C ab_base)   # the code before the change
#   bash scripts/gpu_session18.sh ab            # whole prefill, that code against this checkout's,
#                                               # twice each in turn; the selected dK/dV's launch
#                                               # variants as training runs it; the kernels of one
#                                               # forward+backward
#   bash scripts/gpu_session18.sh dq <rev>      # the selected dQ from dS by loads and by copies at
#                                               # 8k-32k (probe section dq_ds), then the tests below
#   bash scripts/gpu_session18.sh ab8k <rev>    # the whole prefill at 8k, that code against this
#                                               # checkout's, three rounds in turn; the table
#                                               # (PROFILE=h100 or h200); the selected kernel tests
#   bash scripts/gpu_session18.sh tests <rev>   # as in gpu_session15.sh, on the selected, window
#   bash scripts/gpu_session18.sh final <rev>   # and whole-op kernel tests
#
# The eviction-hint A/B (dropped) was the A/B and kernel lines of `ab` without the sweep.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
case "${1:?usage: scripts/gpu_session18.sh ab|dq REV|ab8k REV|tests REV|final REV}" in
ab)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_prefill_probe.py --only sel_dkdv_ds --lengths 8192 65536 2>&1 | tee "$OUT/sweep.txt"
    bash scripts/gpu_ab_prefill.sh ab_base "${LENGTHS:-8192,65536}" 2 2>&1 | grep -v "^batch\|^    1 " | tee "$OUT/ab.txt"
    python scripts/gpu_prefill_probe.py --only kernels --lengths 8192 2>&1 | tee "$OUT/probe.txt"
    ;;
dq)
    python scripts/gpu_prefill_probe.py --only dq_ds --lengths 8192 16384 32768 2>&1 | tee "$OUT/dq_ds.txt"
    TESTS="tests/ops/test_selected_kernel.py tests/ops/test_nsa_attention_kernel.py tests/ops/test_window_kernel.py" \
        exec bash scripts/gpu_session15.sh tests "${2:?dq needs the commit to name the report after}"
    ;;
ab8k)
    bash scripts/gpu_ab_prefill.sh ab_base 8192 3 2>&1 | grep -v "^batch\|^    1 \|^routes" | tee "$OUT/ab.txt"
    P="${PROFILE:-h100}"
    python -m nsa.bench prefill --profile "$P" --budget 4 --csv "$OUT/prefill_$P.csv" --plot "$OUT/prefill_$P.png" 2>&1 | tail -6
    timeout 300 python -m pytest -q -n 3 -m "not benchmark" --gpu-profile auto --nsa-report "$OUT" \
        --nsa-report-commit "${2:?ab8k needs the commit to name the report after}" tests/ops/test_selected_kernel.py 2>&1 | tail -3
    ;;
tests | final)
    TESTS="tests/ops/test_selected_kernel.py tests/ops/test_nsa_attention_kernel.py tests/ops/test_window_kernel.py" \
        exec bash scripts/gpu_session15.sh "$@"
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
