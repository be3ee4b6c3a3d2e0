#!/usr/bin/env bash
# The GPU call of session 71 (H200). No kernel changed; the session cut the CPU suite's time (CI had
# taken 1038 s in all, past its 15-minute budget): Triton's interpreter without the integer overflow
# checks it never asserts and with its dtype table looked up (tests/_interpreter.py), and five slow CPU
# tests with smaller or shared work; the compile test's forced-in-window case now takes the window's
# forced blocks (its old config never did). The same test files on the GPU, at the session's commit:
#
#   bash scripts/gpu_session71.sh tests       # the GPU tests of the changed files (the compile tests,
#                                             # the selection, the compressed kernels, the NSA prefill)
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line

case "${1:-}" in
tests)
    gpu_tests "$(git rev-parse --short HEAD)" tests/test_compile.py tests/ops/test_select_kernel.py \
        tests/ops/test_compressed_kernel.py tests/ops/test_nsa_attention_kernel.py tests/test_interpreter_speedup.py
    ;;
*)
    echo "usage: bash scripts/gpu_session71.sh tests" >&2
    exit 2
    ;;
esac
echo "elapsed $(( $(date +%s) - start )) s"
