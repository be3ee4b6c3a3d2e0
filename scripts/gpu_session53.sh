#!/usr/bin/env bash
# The GPU calls of session 53 (H200). Session 52's stamps (batch 16, 64k): the score launch's
# programs all wait (gdc_wait) for the whole compressed launch, whose last program ends at 44.4 us
# (median program 40.0); the score launch then ends at 52.1 with 2048 programs piled up to 32 on an
# SM, and every selection program waits for that. A score program needs only its own row-group's
# compressed splits: with decode_fwd's score_row_wait each launch-1 program counts itself in its
# row-group's counter once its stores are in L2, each score program polls that counter instead of
# gdc_wait, and the first selection program of each row-group zeroes it for the next step. Row-groups
# whose splits end early are then scored while the pass still runs.
#
#   bash scripts/gpu_session53.sh rowwait  # (ran at a5770ae) variant rounds at batch 16 (8k, 32k, 64k;
#                                          # checked against the float32 reference at 64k) and the
#                                          # stamps at batch 16, 64k, with and without
#
# Slower at batch 16 (64k 73.1-73.2 against 72.8-72.9 us, 8k 40.4-40.6 against 38.0-38.5): the
# row-groups' last compressed programs end within 39.0-43.9 us, so the polls gain little, and the
# count made the pass itself 0.5-0.8 us longer. Then batch 1 with the option (its
# launch 1 holds the window's splits too, all counted), and the decode table (the option off, so
# main's kernels):
#
#   bash scripts/gpu_session53.sh table    # (ran at e2faab5) variant rounds at batch 1 (8k, 64k); the
#                                          # decode table at batch 1-64 (nsa-bench, graph replay, dense
#                                          # in the same run)
#
# Slower at batch 1 too (64k 22.2-22.3 against 20.5-20.7 us): dropped,
# docs/perf/attempts/decode_score_row_wait.patch. Both steps need the option, on the branch
# next/score-row-wait.
#
# Then the prefill table on main (no prefill kernel changed since session 25; last taken in session
# 41), for the closing note:
#
#   bash scripts/gpu_session53.sh prefill  # (ran at b9bac69) nsa-bench prefill, 8k-64k, forward and
#                                          # forward+backward, dense in the same run
#
# The H200's 8k forward: 2.179 ms against dense's 1.995 (0.92x; dense took 1.725-1.951 ms in sessions
# 35 and 41). The sweeps of the window forward's tiles and of the compressed forward's score buffer
# were last run on an H100 (sessions 23 and 24); on the H200, with the forward's kernel list:
#
#   bash scripts/gpu_session53.sh fwd8k    # (ran at efeb3b3) the kernels of one 8k forward (no_grad),
#                                          # then the window forward's tiles and the compressed
#                                          # forward's launches
#
# Nothing faster (the window's default tiles 0.544 ms, the next 0.576; the compressed forward's
# buffers all 0.383-0.386). Where one forward+backward goes on the H200, at 8k and 64k (the
# H100's list is session 21's):
#
#   bash scripts/gpu_session53.sh kernels  # (ran at 10fa620) the kernels of one forward+backward, 8k
#                                          # and 64k
#
# On the H200 the compressed dK/dV is the longest kernel at 64k (21.4 ms, storing dS for the dQ);
# its tiles were chosen on an H100 before it stored dS (sessions 12 and 19). By tiles and query
# chunks, with the dQ from dS, at 8k and 64k:
#
#   bash scripts/gpu_session53.sh dkdvds   # (ran at bf33737) the compressed backward as training calls
#                                          # it, by dK/dV tiles
#
# The default tiles were the fastest at 64k (27.75 ms for the branch's backward; 27.91-97.84 for the
# others) and within 0.02 ms of the best at 8k: nothing changed.
#
# The decode table once more, on main (the same kernels), on another machine:
#
#   bash scripts/gpu_session53.sh table2   # (ran at db67a26) the decode table at batch 1-64
#
# The compressed forward runs at about 423 TFLOP/s at 64k by the spec's count, against cuDNN dense's
# 594: its parts (pass 1 alone; the block masses alone; both), at 8k and 64k:
#
#   bash scripts/gpu_session53.sh cmpparts # (ran at 7e24edc) the compressed forward by what it computes
#
# At 64k: o and lse alone 9.96 ms, the selection alone 13.94, both 18.11 (with the top-n launches):
# p @ v adds 4.2 ms, pass 2 and the top-n about 8.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session53.sh rowwait | table | prefill | fwd8k | kernels | dkdvds | table2 | cmpparts}"
device_line

row_wait='{"score_row_wait": true}'
case "$step" in
rowwait)
    variant_rounds rowwait_b16 16 65536 "8192 32768 65536" 220 "$row_wait"
    decode_stamps rowwait 150 16 '{}' "$row_wait"
    ;;
table)
    variant_rounds rowwait_b1 1 65536 "8192 65536" 100 "$row_wait"
    decode_table h200
    ;;
prefill)
    h200_prefill
    ;;
fwd8k)
    timeout 400 python scripts/gpu_prefill_probe.py --lengths 8192 --only fwd_kernels window cmp_fwd --kernels 20 2>&1 \
        | tee "$OUT/prefill_fwd8k_h200.txt" | grep -v "window dQ"
    ;;
kernels)
    timeout 400 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only kernels fwd_kernels --kernels 24 2>&1 \
        | tee "$OUT/prefill_kernels_h200.txt"
    ;;
dkdvds)
    timeout 500 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only cmp_dkdv_ds 2>&1 \
        | tee "$OUT/prefill_cmp_dkdv_ds_h200.txt"
    ;;
table2)
    decode_table h200
    ;;
cmpparts)
    timeout 300 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only cmp_parts 2>&1 \
        | tee "$OUT/prefill_cmp_parts_h200.txt"
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
