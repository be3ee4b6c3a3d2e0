#!/usr/bin/env bash
# The GPU calls of session 76 (H200). No library kernel changed in sessions 75-76 but the prefill
# top-n; the whole suite had not run on an H200 in one go (the broadest: session 67's 455 tests of the
# ops, the layer and varlen). So: the whole suite on the H200 with the validation report, in two calls
# (a device call runs at most 10 minutes), then the pytest-benchmark baseline's prefill points saved
# again (session 74 saved them before session 75's faster top-n).
#
#   bash scripts/gpu_session76.sh suite_ops REV    # tests/ops on 8 workers sharing the GPU, the
#                                                  # report named after REV, as one tar
#
# At f6a6e0d: 393 passed, 17 skipped in 284 s.
#
#   bash scripts/gpu_session76.sh suite_rest REV   # every other test folder but the benchmarks, the
#                                                  # same way
#
# At f6a6e0d: 779 passed, 4 failed, 4 skipped in 184 s. The four: plugin tests whose runs under the cpu
# profile count a triton test as run, which the plugin skips where Triton's interpreter cannot run the
# kernels (3.6 here). Fixed by faking the software there (tests/plugin/conftest.py).
#
#   bash scripts/gpu_session76.sh baseline         # the H200 baseline's prefill points saved again
#
# 16 points in 112 s: 64k forward 30.66 / 117.7 ms (3.84x), forward+backward 86.33 / 450.3 (5.22x).
#
#   bash scripts/gpu_session76.sh recheck REV      # tests/plugin again after the fix of its four tests
#                                                  # that counted on the machine's Triton interpreter,
#                                                  # reported as one tar; then the probe's section
#                                                  # score_budget at 64k (the score buffer's cap: 256
#                                                  # MiB, 512 MiB, 1 GiB)
#
# At 7408b8e: tests/plugin 185 passed. The 64k forward 29.88-30.25 ms with 256 MiB (the default),
# 29.90-30.19 with 512, 30.19-30.30 with 1 GiB: no gain (the top-n slower on longer chunks).
#
#   bash scripts/gpu_session76.sh final REV        # the whole suite again at the session's last code
#                                                  # (nsa without Triton, the suite's guards), in one
#                                                  # call: tests/ops, then the rest, two reports
#
# At f700c9c: tests/ops 393 passed, 17 skipped; the rest 784 passed, 4 skipped. None failed.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
suite_ops)
    reported_tests 540 "${2:?suite_ops needs the commit to name the report after}" tests/ops
    ;;
suite_rest)
    reported_tests 540 "${2:?suite_rest needs the commit to name the report after}" tests \
        --ignore=tests/ops --ignore=tests/benchmarks
    ;;
baseline)
    save_baseline h200 400 prefill
    ;;
recheck)
    reported_tests 240 "${2:?recheck needs the commit to name the report after}" tests/plugin
    probe_run 300 score_budget --only score_budget --lengths 65536
    ;;
final)
    whole_suite "${2:?final needs the commit to name the reports after}"
    ;;
*)
    echo "usage: bash scripts/gpu_session76.sh suite_ops REV|suite_rest REV|baseline|recheck REV|final REV" >&2
    exit 2
    ;;
esac
