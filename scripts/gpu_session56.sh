#!/usr/bin/env bash
# The GPU calls of session 56 (H200). The compressed forward (16.1 ms of session 55's 64k
# forward+backward, its largest forward kernel) runs pass 2, the scoring pass, in the same program
# as pass 1. Compiled for sm_90, that kernel takes 187 registers and 113 KiB of shared memory: two
# programs an SM, for pass 2 too, which needs neither p @ v's accumulator nor V's tiles. Pass 2 alone
# compiles to 70-128 registers and 49-113 KiB by its tiles: up to four programs an SM.
# compressed_fwd.PASS2_APART (new) runs pass 1 once over every query, leaving the log2-domain lse,
# then each query chunk's pass 2 in a launch of its own (bitwise the same results):
#
#   bash scripts/gpu_session56.sh pass2    # the compressed forward with selection by pass-2 launch
#                                          # (fused, and apart by blocks a step, stages, warps), checked
#                                          # against the fused one; the fastest against the fused in
#                                          # the whole forward and forward+backward (ABBA) and the
#                                          # forward's kernel lists (64k, then 32k)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session56.sh pass2}"
device_line

case "$step" in
pass2)
    probe_run 540 pass2_apart --lengths 65536 32768 --only pass2_apart --kernels 8
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
