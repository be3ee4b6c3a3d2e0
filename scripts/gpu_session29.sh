#!/bin/bash
# The GPU calls of session 29 (parity margins and GPU memory per test in the report):
#
#   bash scripts/gpu_session29.sh suite REV PART   # one part of the suite (but the benchmarks) on 12
#                                                  # workers from an empty Triton cache, with its report
#                                                  # (scripts/gpu_session28.sh suite); the parts, each
#                                                  # well under the device's 10 minutes a command:
#                                                  #   prefill: test_nsa_attention_kernel.py
#                                                  #   branches: test_compressed_kernel.py, test_window_kernel.py
#                                                  #   rest: everything else
#   bash scripts/gpu_session29.sh recheck REV      # the tests changed after the suite ran: the selected
#                                                  # branch's real sizes (now alone), the report's tests
#   PROBE_OUT=... python -m pytest -p gpu_memory_probe ...
#                                                  # memory outside torch's allocator per test
#                                                  # (scripts/gpu_memory_probe.py)
here="$(dirname "$0")"
step="${1:?usage: scripts/gpu_session29.sh suite REV prefill|branches|rest | recheck REV}"
rev="${2:?the commit to name the report after}"
case "$step" in
suite)
    case "${3:?which part: prefill, branches or rest}" in
    prefill) bash "$here/gpu_session28.sh" suite "$rev" prefill tests/ops/test_nsa_attention_kernel.py ;;
    branches) bash "$here/gpu_session28.sh" suite "$rev" branches tests/ops/test_compressed_kernel.py \
        tests/ops/test_window_kernel.py ;;
    rest) bash "$here/gpu_session28.sh" suite "$rev" rest --ignore=tests/ops/test_nsa_attention_kernel.py \
        --ignore=tests/ops/test_compressed_kernel.py --ignore=tests/ops/test_window_kernel.py ;;
    *) echo "unknown part $3" >&2; exit 2 ;;
    esac
    ;;
recheck)
    bash "$here/gpu_session28.sh" suite "$rev" recheck "tests/ops/test_selected_kernel.py::test_selected_gpu_bf16" \
        tests/plugin/test_report.py tests/plugin/test_gpu_memory.py
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
