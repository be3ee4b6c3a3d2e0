#!/usr/bin/env bash
# The GPU calls of session 59 (H200). Triton 3.6 compiles warp specialisation for sm_90 (a
# producer warp issuing the bulk copies, the others computing) for a flash-attention loop over
# tensor-descriptor loads at 4 warps (offline, session 59; session 16 had found it failing for the
# window kernels). Whether it pays, on the compressed forward's loop shape, before any library
# kernel takes it:
#
#   bash scripts/gpu_session59.sh ws          # scripts/gpu_ws_probe.py: the loop with pointer loads,
#                                             # descriptor loads, and descriptor loads specialised
#                                             # (ran at d0767dc; stopped by its 500-s limit after the
#                                             # 64-row specialised loops)
#
# Specialised, the loop took 1.7-1.9 times as long (64 rows: 249-262 TFLOP/s against 435-478 for
# the same descriptor loads unspecialised), and with 3 stages it returned NaN: wrong code. The best
# plain loop was 128 rows of 4 warps, 64-key tiles, 2 stages: 511 TFLOP/s by descriptors, 491 by
# pointers. Not taken further.
#
# A decode step at batch 16, 64k moves its window (17 MB) in the selected launch, beside the
# selection programs' blocks, while the compressed pass's last programs run alone for 5-13 us.
# window_last (new, off) puts the window's splits back in launch 1 but numbered after every
# compressed split, so that the GPU places them in the slots the pass leaves as it ends (session 52
# had measured the window in launch 1 with fewer compressed splits, to keep one wave: slower):
#
#   bash scripts/gpu_session59.sh wlast       # gpu_decode.py: window_last (and with the window's
#                                             # descriptors) against the default in turn, batch 16,
#                                             # 32, 64 at 64k and batch 16 at 8k, 32k, each checked
#                                             # against the float32 reference at 64k (ran at
#                                             # d0767dc; the option, its tests and the trace
#                                             # script's anchor are in
#                                             # docs/perf/attempts/decode_window_last.patch)
#
# The same results (2.06e-3 and 2.14e-3 against the reference, 100 % blocks), but slower at every
# point: batch 16 at 64k 77.2-78.1 us against 72.6-72.7 (ABCACB), batch 32 128.3-128.9 against
# 122.5, batch 64 251.8-254.7 against 228.3-228.9, batch 16 at 8k 44.8 against 38.2-38.8 and at 32k
# 58.9-59.1 against 52.1-52.2. Eager, launch 1 took 46.0 us against 39.0 and the selected launch 13.2
# against 17.1: the window's programs are placed only as the pass's programs end, and its last
# ones end about 7 us after the pass would have. Dropped.
#
#   bash scripts/gpu_session59.sh desc        # probe section pass1_desc at 64k and 16k: pass 1 of the
#                                             # compressed forward with its whole key/value tiles
#                                             # through tensor descriptors (PASS2_APART["pass1"]
#                                             # ["kv_desc"], new, off), checked bitwise, then ABBA in
#                                             # the forward and forward+backward, and kernel lists
#                                             # (ran at a14ca10)
#
# Bitwise the same, and at 64k the compressed forward with selection 15.89-15.97 ms against
# 16.19-16.22, its kernels 14.03-14.20 against 14.29-14.39, the forward 0.2-0.3 ms shorter in 3 of 4
# ABBA rounds and the forward+backward 0.1-0.3 in all 4; 16k unchanged (pass 2 is fused there).
# Kept as the default (97eb4f3).
#
#   bash scripts/gpu_session59.sh tests REV   # the GPU tests of the compressed, selection and
#                                             # whole-attention kernels at the descriptors' default
#                                             # (report named after REV) (ran at 97eb4f3)
#
# 103 passed, 1 failed: the new CPU case of test_pass2_apart_equals_the_fused_launch in 8-token
# tiles, which a GPU's dot does not take. At 477f3eb (16-token tiles on a GPU) the selection tests
# passed, 42, by a direct call (`source scripts/gpu_env.sh && reported_tests 150 477f3eb
# tests/ops/test_select_kernel.py`); then the prefill table again at 221d805 (`h200_prefill`):
# 64k 32.85 / 120.4 ms (3.66x) forward, 98.41 / 457.6 (4.65x) forward+backward, 8k 0.88x and 1.07x.
#
#   bash scripts/gpu_session59.sh final       # nsa-bench prefill (8k-64k) and decode (batch 1-64) at
#                                             # main's kernels (those of session 57), then the
#                                             # probe's 128-row loops the ws call did not reach
#                                             # (specialised, and descriptors in 4 and 8 warps)
#                                             # (ran at 307b793)
#
# Prefill 64k 32.97 / 117.9 ms (3.58x) forward, 95.34 / 449.2 (4.71x) forward+backward, 8k 0.80x
# (against a dense forward of 1.739 ms) and 1.06x; decode at 64k 19.17 / 49.22 us (2.57x) at batch
# 1, 71.41 / 482.6 (6.76x) at batch 16, 7.49x at 32, 7.80x at 64. The probe timed the 128-row
# descriptor loops again (512 TFLOP/s at 4 warps, 2 stages) and then spent its remaining 3 minutes
# compiling the first specialised 128-row loop, unfinished.
#
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session59.sh STEP [REV]}"
device_line
case "$step" in
ws)
    timeout 500 python scripts/gpu_ws_probe.py 2>&1 | tee "$OUT/ws_probe_h200.txt"
    ;;
wlast)
    WL='{"window_last": true}'
    WLD='{"window_last": true, "win_desc": true}'
    timeout 330 python scripts/gpu_decode.py --contexts 65536 --check-contexts 65536 --batches 16 32 64 --variants \
        --check-variants --launch "$WL" --launch "$WLD" --launch '{}' --launch "$WLD" --launch "$WL" \
        --out "$OUT/decode_window_last_64k_h200.md" > "$OUT/wlast_64k.log" 2>&1
    echo "== 64k: rc $? after $(( $(date +%s) - start )) s"; grep -E "^- B=|^\| 65536" "$OUT/wlast_64k.log"
    timeout 200 python scripts/gpu_decode.py --contexts 8192 32768 --check-contexts 8192 --batches 16 --variants 8192 32768 \
        --launch "$WL" --launch '{}' --launch "$WL" --out "$OUT/decode_window_last_b16_h200.md" > "$OUT/wlast_b16.log" 2>&1
    echo "== 8k, 32k: rc $? after $(( $(date +%s) - start )) s"; grep -E "^- B=" "$OUT/wlast_b16.log"
    ;;
desc)
    probe_run 420 pass1_desc --lengths 65536 16384 --only pass1_desc --kernels 8
    ;;
tests)
    rev="${2:?the tests step needs the commit to name the report after}"
    reported_tests 300 "$rev" tests/ops/test_compressed_kernel.py tests/ops/test_select_kernel.py \
        tests/ops/test_nsa_attention_kernel.py
    ;;
final)
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    timeout 240 python scripts/gpu_ws_probe.py --kinds desc ws --rows-per-tile 128 2>&1 | tee "$OUT/ws_probe_128_h200.txt"
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
