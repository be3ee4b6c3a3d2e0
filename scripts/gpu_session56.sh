#!/usr/bin/env bash
# The GPU calls of session 56 (H200). The compressed forward (16.1 ms of session 55's 64k
# forward+backward, its largest forward kernel) runs pass 2, the scoring pass, in the same program
# as pass 1. Compiled for sm_90, that kernel takes 187 registers and 113 KiB of shared memory: two
# programs an SM, for pass 2 too, which needs neither p @ v's accumulator nor V's tiles. Pass 2 alone
# compiles to 70-128 registers and 49-113 KiB by its tiles: up to four programs an SM.
# compressed_fwd.PASS2_APART (new) runs pass 1 once over every query, leaving the log2-domain lse,
# then each query chunk's pass 2 in a launch of its own (bitwise the same results):
#
#   bash scripts/gpu_session56.sh pass2    # (ran at 2798466) the compressed forward with selection by
#                                          # pass-2 launch (fused, and apart by blocks a step, stages,
#                                          # warps), checked against the fused one; the fastest against
#                                          # the fused in the whole forward and forward+backward (ABBA)
#                                          # and the forward's kernel lists (64k, then 32k)
#
# Every split gave the fused launch's o, lse and blocks bitwise. The fastest, 16 blocks a step in 2
# stages (4 programs an SM): the launch alone 17.49-17.67 ms at 64k against 17.69-17.92 fused, 4.76
# against 4.88-4.95 at 32k; the whole forward shorter in every ABBA round (64k 34.11-34.38 against
# 34.21-34.78, 32k 12.84-12.91 against 12.98-13.01), the compressed kernels in place 15.23-15.42
# against 15.46-15.87 at 64k; forward+backward the same within noise (64k 97.86-98.90 against
# 97.76-98.93). Kept as the default (PASS2_APART); its tiles around that point, and the GPU tests
# (a new one at 20k tokens, where pass 2 runs apart, against the fused launch):
#
#   bash scripts/gpu_session56.sh tiles REV  # (ran at 7c9060a) pass-2 tiles (64k, 32k); the select,
#                                            # compressed and nsa_attention GPU tests (report named
#                                            # after REV)
#
# Tiles of 128 rows (8 query positions, 8 warps) in 16-block steps and 2 stages: 16.63-16.90 ms at
# 64k against 17.43-17.62 fused and 17.18-17.36 for the default of the step before (64 rows), 4.57
# against 4.87-4.90 at 32k; 32-block steps the same, 3 stages and 8-block steps slower. The GPU tests:
# 98 passed, 1 failed (the short-tiles test counted the launches of pass 2 apart: it now keeps pass 2
# fused, which its own tests cover). The 128-row tiles are the default now; wider ones, and the
# default against the fused launch in the whole forward and forward+backward:
#
#   bash scripts/gpu_session56.sh wide REV   # (ran at 22d23a2) pass-2 tiles of 128 and 256 rows, then
#                                            # the default against fused in ABBA rounds and the kernel
#                                            # lists (64k); the select and compressed GPU tests (report
#                                            # named after REV)
#
# 256 rows (16 warps) slower (18.14-18.80 ms), 128 rows in 8-block steps too (17.72-18.16); the
# default 16.89-17.21 against 17.70-17.94 fused. The whole forward shorter in every ABBA round:
# 33.61-33.88 ms flushed against 34.16-34.78; forward+backward 96.86-97.25 against 97.02-98.15 (three
# rounds of four shorter); the compressed kernels in place 14.81-14.98 against 15.83-15.90 ms. The
# GPU tests passed (66). The tables at these kernels:
#
#   bash scripts/gpu_session56.sh final      # (ran at dbdd126) nsa-bench prefill (8k-64k), then
#                                            # nsa-bench decode (batch 1-64, graph replay); dense in the
#                                            # same runs
#
# Prefill: 8k 2.185 / 1.904 ms (0.87x) and 7.101 / 7.551 (1.06x); 64k 33.92 / 118.5 (3.49x) and 97.03
# / 446.5 (4.60x). Decode at 64k: batch 1 19.12 / 49.30 us (2.58x), batch 16 71.04 / 487.3 (6.86x).
# With pass 2 apart, pass 1 runs alone too, and its tiles need not be the fused kernel's
# (PASS2_APART["pass1"], new):
#
#   bash scripts/gpu_session56.sh pass1      # (ran at 707c4bd) pass 1's tiles where pass 2 runs apart
#                                            # (64k, 32k)
#
# The fused launch's own tiles stay fastest for pass 1 (64k 16.88-17.12 ms; 32-token tiles 17.57-18.73,
# 128 rows of 8 warps 17.54-17.67; 32k 4.60 against 4.68-4.99); the fused launch itself 17.54-18.00
# and 4.92-4.93. Nothing changed.
#
# Pass 2's three programs of 8 warps an SM leave registers and warp slots for one of the top-n's
# (2 warps, 70 registers). PASS2_APART["topn_beside"] (new, off) runs each chunk's top-n on a second
# stream of high priority beside the next chunk's pass 2, two score buffers in turn:
#
#   bash scripts/gpu_session56.sh beside REV # (ran at 1ffd232, on the branch next/topn-beside) the
#                                            # compressed forward alone, the whole forward and
#                                            # forward+backward (ABBA) and the kernel lists with the
#                                            # top-n after or beside (64k, 32k); the select GPU tests
#                                            # (report named after REV)
#
# Bitwise the same results (the GPU tests passed, 43, a real-size one with it on among them), but no
# faster: the 64k forward 33.78-34.00 ms flushed against 33.40-33.98, forward+backward 96.59-96.86
# against 95.69-97.37; in place pass 2 took longer beside the top-n (the compressed kernels 15.37-15.41
# ms against 14.57-14.67), and the top-n no shorter (1.66-1.67 against 1.60-1.61). 32k the same within
# noise. Dropped (docs/perf/attempts/prefill_topn_beside.patch).
#
# The window kernels also compute the selected branch's forced blocks (NSA_FORCED_IN_WINDOW, on since
# session 15, chosen on an H100 with that session's kernels), at the price of a second accumulator:
# 220 registers, two programs an SM. The flag on and off again, at this session's kernels:
#
#   bash scripts/gpu_session56.sh forced     # (ran at 8456e10) the whole forward and forward+backward
#                                            # (ABBA) and the forward's kernel lists, the flag on and
#                                            # off (8k, 64k)
#
# On stays faster: 8k forward 2.197-2.253 ms against 2.365-2.422, forward+backward 7.137-7.358
# against 7.593-7.793; 64k 33.53-33.96 against 35.17-35.32 and 97.04-98.64 against 100.6-102.5. The
# window forward without the forced blocks took 4.19-4.25 ms at 64k against 4.58-4.63 with them, but
# the forced-block kernel 2.07-2.12. Nothing changed.
#
# The prefill table once more, on another machine, at the final code:
#
#   bash scripts/gpu_session56.sh table2     # (ran at bcb8aa4) nsa-bench prefill (8k-64k, dense in the
#                                            # same run)
#
# 8k 2.178 / 1.796 ms (0.82x, dense fast on this machine) and 7.137 / 7.572 (1.06x); 64k 33.77 / 117.8
# (3.49x again) and 98.41 / 450.2 (4.57x). Last, the GPU tests of the files that run the compressed
# forward, at the final code:
#
#   bash scripts/gpu_session56.sh tests REV  # (ran at 9a3122a) the select, compressed and nsa_attention
#                                            # GPU tests (report named after REV)
#
# 99 passed, 4 skipped.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session56.sh pass2 | tiles REV | wide REV | final | pass1 | beside REV | forced | table2 | tests REV}"
device_line

case "$step" in
pass2)
    probe_run 540 pass2_apart --lengths 65536 32768 --only pass2_apart --kernels 8
    ;;
tiles)
    rev="${2:?the tiles step needs the commit to name the test report after}"
    probe_run 240 pass2_tiles --lengths 65536 32768 --only pass2_tiles
    reported_tests 300 "$rev" tests/ops/test_select_kernel.py tests/ops/test_compressed_kernel.py \
        tests/ops/test_nsa_attention_kernel.py
    ;;
wide)
    rev="${2:?the wide step needs the commit to name the test report after}"
    probe_run 300 pass2_wide --lengths 65536 --only pass2_wide --kernels 6
    reported_tests 240 "$rev" tests/ops/test_select_kernel.py tests/ops/test_compressed_kernel.py
    ;;
final)
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
pass1)
    probe_run 240 pass1_tiles --lengths 65536 32768 --only pass1_tiles
    ;;
beside)
    rev="${2:?the beside step needs the commit to name the test report after}"
    probe_run 300 topn_beside --lengths 65536 32768 --only topn_beside --kernels 6
    reported_tests 200 "$rev" tests/ops/test_select_kernel.py
    ;;
forced)
    probe_run 300 forced_place --lengths 8192 65536 --only forced_place --kernels 8
    ;;
table2)
    h200_prefill
    ;;
tests)
    reported_tests 200 "${2:?the tests step needs the commit to name the test report after}" \
        tests/ops/test_select_kernel.py tests/ops/test_compressed_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
