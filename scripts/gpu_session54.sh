#!/usr/bin/env bash
# The GPU calls of session 54 (H200). Session 53 listed one 64k forward+backward's kernels on the
# H200: the window's dK/dV takes 7.34 ms. Each of its programs (one key tile of 128) walks the
# 640 query positions that see the tile from the first; the next tile's program reads the same q
# and do rows one run of 128 positions later, after every running program has read a fifth of its
# band (about 138 MB at 64k, past L2: session 6 found the kernel DRAM-bound on an H100). Phased
# (PHASED, new), each band is walked from the run whose index is a multiple of the band's run
# count, wrapping: the five key tiles that share a run walk it at the same time. The sweep also
# takes tiles of 32 rows, which compile without spills (the default 64-row tiles spill 328 bytes a
# thread on sm_90):
#
#   bash scripts/gpu_session54.sh phased REV  # (ran at ea3a887) the window's dK/dV as training launches
#                                          # it, walked or phased, by tiles, at 8k and 64k; the whole
#                                          # forward+backward with each as the default; then the GPU
#                                          # tests of the window and nsa_attention kernels (phased)
#
# Phased, the kernel took 8.30 ms at 64k against 9.18 for the walk, and on 32-row tiles 7.35; the
# whole forward+backward 99.6-99.7 against 100.8-100.9 (8k: 7.12 against 7.26-7.47). The GPU tests
# passed (53, 4 skipped). 32-row tiles phased became the default; around them (the walk on them, 16
# rows, 4 stages), then the prefill table at the new default:
#
#   bash scripts/gpu_session54.sh table    # (ran at 7b25358) the sweep again, then nsa-bench prefill
#                                          # (8k-64k, dense in the same run)
#
# On 32-row tiles the walk from the band's start was as fast as the phased one (64k: 7.25-7.37 ms
# alone, 96.6-96.7 the whole forward+backward, against 7.35 and 96.6-96.8), so the phasing was
# dropped and the 32-row tiles kept (8k 0.910 against 1.176-1.179 ms, 64k 7.25-7.37 against 9.24;
# the whole 64k forward+backward 96.6-96.7 against 98.2-98.9). Both steps above need the option,
# on the branch next/window-phased. The table: 64k forward+backward 96.49 against dense's 445.9
# (4.62x). The compressed dK/dV holds 255 registers and spills 16 bytes a thread on its 64-row
# tiles, none on 32-row ones (226 registers): those tiles, the kernels of one 64k forward+backward
# at the new window tiles, and the GPU tests of the changed kernels, on main:
#
#   bash scripts/gpu_session54.sh tiles REV  # the compressed backward by dK/dV tiles (8k, 64k), the
#                                            # whole forward+backward where another is faster; the
#                                            # kernel list at 64k; the window, compressed and
#                                            # nsa_attention GPU tests (report named after REV)
#
# 32-row query tiles made the compressed backward slower (64k 35.6-42.4 ms against 28.6; 8k 0.80
# against 0.68): its tiles stay. The GPU tests passed (72, 4 skipped). The kernel list put the
# window's dK/dV at 8.83 ms and its dQ at 5.34, against 7.34 and 4.92 in session 53's list on another
# machine (the whole forward+backward's kernels 95.8 against 94.6), though alone and in the whole
# step the 32-row tiles were faster. The list with each tile in turn, then the decode table:
#
#   bash scripts/gpu_session54.sh inplace  # (ran at b883677, one step a list) the kernels of one 64k
#                                          # forward+backward, the window's dK/dV on 32- and 64-row
#                                          # tiles in turn, twice; the decode table at batch 1-64 (no
#                                          # decode kernel changed)
#
# In place the window's dK/dV took 8.59 and 8.71 ms on 32-row tiles, 7.50 and 8.33 on 64-row ones,
# but one profiled step is noisy (its kernels summed to 94.9-98.2 ms, the compressed forward
# 15.6-17.0). The same lists as the mean of 5 steps each (the decode table is not taken again):
#
#   bash scripts/gpu_session54.sh inplace5 # (ran at ce35d32) the kernel lists, 5 steps a list
#
# In place the window's dK/dV took 8.46-8.53 ms on 32-row tiles and 7.52-7.57 on 64-row ones, and
# the kernels summed to 96.38-96.45 against 96.28-96.39 ms: unlike the whole step under do_bench
# (L2 flushed before each call), 1.2-2.3 ms shorter on 32-row tiles in both sweeps. The step timed
# both ways, each tile in turn:
#
#   bash scripts/gpu_session54.sh step     # (ran at 371c1f1, rounds in the order ABAB) the whole 64k
#                                          # forward+backward, do_bench and 5 calls back to back,
#                                          # three rounds
#
# The 32-row tiles, first in each round, were the slower here: 97.93-98.85 ms flushed against
# 97.10-97.42, 98.10-99.21 back to back against 97.72-98.12. In the sweeps' A/Bs the 64-row tiles came
# first in each round. So once more with the rounds in the order ABBA, at 8k and 64k:
#
#   bash scripts/gpu_session54.sh abba     # (ran at fc412db) the same step timings, four rounds
#                                          # ABBA, 8k and 64k
#
# The 32-row tiles were the slower in every round: 64k 98.36-98.77 ms flushed against 96.97-97.71,
# 98.80-98.99 back to back against 97.26-98.01; 8k 7.01-7.13 against 6.93-7.07. The 64-row tiles
# are the default again (the steps from "tiles" on ran with the 32-row tiles as the default; the
# probe then named the 64-row ones first). The phased walk had been measured alone only; in place,
# on 64-row tiles, on the branch next/window-phased (its default there):
#
#   bash scripts/gpu_session54.sh phased64  # (ran at 9ac001c, on the branch) the kernel lists (5 steps
#                                           # a list) and the ABBA step timings, walked and phased
#
# Phased, the window's dK/dV took 8.99-9.03 ms in place against 9.66-10.05, and the whole step was
# shorter in every round: 64k 98.33-98.69 ms flushed against 99.21-99.71, 8k 7.11-7.20 against
# 7.20-7.28. Once more on a fresh machine:
#
#   bash scripts/gpu_session54.sh phased64b # (ran at 972f7b2, on the branch) the ABBA step timings
#
# 64k 99.76-100.14 against 100.76-101.50, 8k 7.16-7.33 against 7.31-7.49: the phased walk on 64-row
# tiles is main's default (the probe's sweep names it first). The steps inplace to abba compare the
# first two tiles of the probe's WINDOW_DKDV_SWEEP, as it stood at the commits named: run on main now,
# they compare the phased walk with the walk from the band's start, as phased64 does.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session54.sh phased REV | table | tiles REV | inplace | inplace5 | step | abba | phased64 | phased64b}"
device_line

case "$step" in
phased)
    timeout 330 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only win_phased 2>&1 \
        | tee "$OUT/prefill_win_phased_h200.txt"
    echo "== probe after $(( $(date +%s) - start )) s"
    # the commit from the caller: the device's git metadata can lag the tree it runs (this step's
    # report, run with git rev-parse there, names 325c31f for ea3a887's tree)
    reported_tests 220 "${2:?phased needs the commit to name the test report after}" \
        tests/ops/test_window_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
table)
    timeout 300 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only win_phased 2>&1 \
        | tee "$OUT/prefill_win_phased2_h200.txt"
    echo "== probe after $(( $(date +%s) - start )) s"
    h200_prefill
    echo "== table after $(( $(date +%s) - start )) s"
    ;;
tiles)
    rev="${2:?the tiles step needs the commit to name the test report after}"
    timeout 300 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only cmp_dkdv_ds 2>&1 \
        | tee "$OUT/prefill_cmp_dkdv_ds_h200.txt"
    echo "== sweep after $(( $(date +%s) - start )) s"
    timeout 120 python scripts/gpu_prefill_probe.py --lengths 65536 --only kernels --kernels 24 2>&1 \
        | tee "$OUT/prefill_kernels_h200.txt"
    echo "== kernels after $(( $(date +%s) - start )) s"
    reported_tests 200 "$rev" tests/ops/test_window_kernel.py tests/ops/test_nsa_attention_kernel.py \
        tests/ops/test_compressed_kernel.py
    ;;
inplace)
    timeout 200 python scripts/gpu_prefill_probe.py --lengths 65536 --only win_dkdv_kernels --kernels 12 2>&1 \
        | tee "$OUT/prefill_win_dkdv_kernels_h200.txt"
    echo "== kernels after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
inplace5)
    timeout 300 python scripts/gpu_prefill_probe.py --lengths 65536 --only win_dkdv_kernels --kernels 12 2>&1 \
        | tee "$OUT/prefill_win_dkdv_kernels5_h200.txt"
    ;;
step)
    timeout 300 python scripts/gpu_prefill_probe.py --lengths 65536 --only win_dkdv_step 2>&1 \
        | tee "$OUT/prefill_win_dkdv_step_h200.txt"
    ;;
abba)
    timeout 300 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only win_dkdv_step 2>&1 \
        | tee "$OUT/prefill_win_dkdv_abba_h200.txt"
    ;;
phased64)
    timeout 200 python scripts/gpu_prefill_probe.py --lengths 65536 --only win_dkdv_kernels --kernels 12 2>&1 \
        | tee "$OUT/prefill_win_phased64_kernels_h200.txt"
    timeout 200 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only win_dkdv_step 2>&1 \
        | tee "$OUT/prefill_win_phased64_abba_h200.txt"
    ;;
phased64b)
    timeout 200 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only win_dkdv_step 2>&1 \
        | tee "$OUT/prefill_win_phased64_abba2_h200.txt"
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
