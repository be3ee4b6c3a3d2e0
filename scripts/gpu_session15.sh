#!/bin/bash
# The GPU calls of session 15 (docs/perf/prefill.md, "Session 15"), one step per call:
#
#   bash scripts/gpu_session15.sh ab            # whole prefill with the forced blocks in the window
#                                               # kernel (NSA_FORCED_IN_WINDOW=1) against the
#                                               # forced-block kernels (=0), each twice in turn, then
#                                               # every kernel's time in one forward+backward
#   bash scripts/gpu_session15.sh tests <rev>   # GPU tests of the changed kernels and paths, the
#                                               # report named after <rev>
#   bash scripts/gpu_session15.sh final <rev>   # the table (PROFILE=h100 or h200), then the tests
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
# the test files of `tests` and `final` (later sessions' scripts pass their own)
TESTS="${TESTS:-tests/ops/test_window_kernel.py tests/ops/test_selected_kernel.py tests/ops/test_nsa_attention_kernel.py
       tests/ops/test_gates_kernel.py tests/test_flags.py}"
case "${1:?usage: scripts/gpu_session15.sh ab|tests REV|final REV}" in
ab)
    for round in 1 2; do
        for flag in 0 1; do
            echo "== NSA_FORCED_IN_WINDOW=$flag, round $round"
            NSA_FORCED_IN_WINDOW=$flag python -m nsa.bench prefill --lengths "${LENGTHS:-8192,65536}" --budget 4 \
                --baseline none 2>&1 | grep -v "^batch\|^    1 "
        done
    done 2>&1 | tee "$OUT/ab.txt"
    python scripts/gpu_prefill_probe.py --only kernels --lengths 8192 65536 2>&1 | tee "$OUT/probe.txt"
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
