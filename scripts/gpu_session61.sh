#!/usr/bin/env bash
# The GPU calls of session 61 (H200). Session 60's Gluon probe found a plain Gluon attention loop
# 2 % faster than Triton's, and an overlap inside one warpgroup no faster. Does the hand-written
# Hopper kernels' form (a copy warp, two computing warpgroups taking turns on the tensor cores)
# pay in Gluon?
#
#   bash scripts/gpu_session61.sh ws          # scripts/gpu_gluon_ws_probe.py (new): the
#                                             # specialised loop with and without turns, 64 or 128
#                                             # rows a warpgroup, 2 or 3 slots, at 2048 and 8192 keys,
#                                             # each configuration in a process of its own under a
#                                             # timeout; session 60's best Gluon loop and Triton's
#                                             # timed before and after (ran at c08dd8a's probe)
#
# TFLOP/s at 2048 / 8192 keys: Triton 512-514 / 531, session 60's Gluon loop 523 / 552-557, the
# specialised loop (2 x 64 rows, 128-key tiles, 3 slots) 549-551 / 600-607: 7 % and 14 % faster than
# Triton. The turns add nothing at 64 rows a warpgroup; at 128 rows (spilling) everything is slower.
#
# The compressed dK/dV is the longest kernel of the 64k forward+backward. Does the same form (a
# copy warp, two computing warpgroups of 64 keys each) shorten its loop?
#
#   bash scripts/gpu_session61.sh bwd         # scripts/gpu_gluon_bwd_probe.py (new): the library's
#                                             # dK/dV step in Triton at its Hopper tiles against the
#                                             # specialised Gluon loop in 2-4 slots, with and without
#                                             # the dS stores, each in a process of its own (three
#                                             # calls as the probe grew: dS from registers, after the
#                                             # wait, in 8 KiB tiles)
#
# ms for 4.4 TFLOP: Triton 10.34-10.44 with dS, 9.02-9.09 without; Gluon 7.24-7.38 without dS (1.24x),
# 9.47-9.72 with it (TMA stores after the next score products; after the wait, in tiles or from
# registers no better, 9.52-11.9).
#
#   bash scripts/gpu_session61.sh final       # the dS stores' proxy fence left out (a measurement)
#                                             # or moved before the next score products; then
#                                             # nsa-bench prefill (8k-64k) and decode (batch 1-64)
#                                             # (ran at c08dd8a)
#
# Without the fence 9.49-9.51 ms (and wrong dS): not the fence. Stored before the next score
# products: 9.16 ms at 2 slots, 8.57-8.64 at 4, 1.20x Triton's 10.37. Prefill 64k 32.73 / 118.8 ms
# (3.63x) forward, 97.21 / 451.4 (4.64x) forward+backward, 8k 0.79x and 1.07x; decode at 64k
# 19.25 / 50.21 us (2.61x) at batch 1, 71.65 / 493.5 (6.89x) at batch 16, 7.84x at 32, 7.97x at 64.
#
# The compressed dK/dV in Gluon in the library (src/nsa/ops/compressed/gluon_dkdv.py, behind
# NSA_GLUON_COMPRESSED_DKDV): its GPU tests against the Triton kernel, then the whole 64k and 8k
# forward+backward with the flag off and on (ABBA) and the kernel lists:
#
#   bash scripts/gpu_session61.sh gluon       # (ran twice on branch next/gluon-dkdv's tree, which
#                                             # has the kernel, its test and the probe section)
#
# Correct both times (5 passed; every gradient within 3.0e-4 of the Triton path's), slower in place:
# the kernel 25.2-25.3 ms at 64k against Triton's 21.7-21.9 (the step 97.9-98.7 against 95.3-96.0),
# 0.60 against 0.50 at 8k; the second form, with the row vectors loaded before the wait and the gate
# folded into the lse, 30.3-30.5 ms. Kept on the branch, not in main.
#
# Is it the library kernel's copies of 16 rows (a position's heads; the probe copies 64 rows at
# once)?
#
#   bash scripts/gpu_session61.sh copies      # the probe's best configuration with 4 copies of 16
#                                             # rows a step, against 1 copy of 64 and Triton
#
# 9.23 ms against 8.57 (and 7.67 without dS): the copies cost the probe 8 %, still 1.12x Triton's
# 10.38; not the whole gap.
#
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session61.sh STEP}"

device_line
case "$step" in
ws)
    n_configs=$(python -c "import sys; sys.path.insert(0, 'scripts'); import gpu_gluon_ws_probe as p; print(len(p.CONFIGS))")
    for keys in 2048 8192; do
        for i in "$n_configs" $((n_configs + 1)) $(seq 0 $((n_configs - 1))) $((n_configs + 1)) "$n_configs"; do
            timeout 60 python scripts/gpu_gluon_ws_probe.py --keys "$keys" --configs "$i" 2>&1 | grep -v "^device" \
                | sed "s/^/keys $keys: /" | tee -a "$OUT/gluon_ws_probe_h200.txt"
            [ "${PIPESTATUS[0]}" -eq 124 ] && echo "keys $keys config $i: timed out (60 s)" | tee -a "$OUT/gluon_ws_probe_h200.txt"
        done
    done
    ;;
bwd)
    bwd_probe 0 14 1 2 10 3 11 15 18 16 19 17 20 14 0
    ;;
final)
    bwd_probe 0 3 21 22 23 24 3 0
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
copies)
    bwd_probe 24 25 26 0
    ;;
gluon)
    timeout 200 python -m pytest -q -p no:cacheprovider --gpu-profile auto -rs --durations=6 \
        tests/ops/test_gluon_dkdv.py 2>&1 | tail -15
    timeout 220 python scripts/gpu_prefill_probe.py --lengths ${GLUON_LENGTHS:-65536 8192} --only gluon_dkdv 2>&1 \
        | grep -v Warning | tee "$OUT/prefill_gluon_dkdv_h200.txt" | tail -60
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
