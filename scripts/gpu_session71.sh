#!/usr/bin/env bash
# The GPU call of session 71 (H200). No kernel changed; the session cut the CPU suite's time (CI had
# taken 1038 s in all, past its 15-minute budget): Triton's interpreter without the integer overflow
# checks it never asserts and with its dtype table looked up (tests/_interpreter.py), and five slow CPU
# tests with smaller or shared work; the compile test's forced-in-window case now takes the window's
# forced blocks (its old config never did). The same test files on the GPU, at the session's commit:
#
#   bash scripts/gpu_session71.sh tests 2ee1d00   # the GPU tests of the changed files (the compile
#                                                 # tests, the selection, the compressed kernels, the NSA
#                                                 # prefill); the report named after the commit given
#
# At 2ee1d00: 125 passed, 7 skipped (the interpreter's own tests and the small float32 sizes that only
# the interpreter runs), 4m13s on 3 workers (docs/perf/raw/session71_gpu_tests_h200.md). That call took
# the report's name from the device checkout's git metadata, which still said 23f61ea (the session's
# first commit); the tree it ran was 2ee1d00's (its test_interpreter_speedup.py lines 60, 104 and 113
# are the new tests). The commit is now the step's second argument.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line

case "${1:-}" in
tests)
    gpu_tests "${2:?the commit the tree is at (the git metadata of the device copy may lag behind it)}" \
        tests/test_compile.py tests/ops/test_select_kernel.py \
        tests/ops/test_compressed_kernel.py tests/ops/test_nsa_attention_kernel.py tests/test_interpreter_speedup.py
    ;;
*)
    echo "usage: bash scripts/gpu_session71.sh tests COMMIT" >&2
    exit 2
    ;;
esac
echo "elapsed $(( $(date +%s) - start )) s"
