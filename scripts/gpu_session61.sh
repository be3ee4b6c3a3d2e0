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
#                                             # timed before and after
#
# The compressed dK/dV is the longest kernel of the 64k forward+backward. Does the same form (a
# copy warp, two computing warpgroups of 64 keys each) shorten its loop?
#
#   bash scripts/gpu_session61.sh bwd         # scripts/gpu_gluon_bwd_probe.py (new): the library's
#                                             # dK/dV step in Triton at its Hopper tiles against the
#                                             # specialised Gluon loop in 2-4 slots, with and without
#                                             # the dS stores, each in a process of its own
#
#   bash scripts/gpu_session61.sh final       # the dS stores' proxy fence left out (a measurement)
#                                             # or moved before the next score products; then
#                                             # nsa-bench prefill (8k-64k) and decode (batch 1-64)
#
# The compressed dK/dV in Gluon in the library (src/nsa/ops/compressed/gluon_dkdv.py, behind
# NSA_GLUON_COMPRESSED_DKDV): its GPU tests against the Triton kernel, then the whole 64k and 8k
# forward+backward with the flag off and on (ABBA) and the kernel lists:
#
#   bash scripts/gpu_session61.sh gluon
#
# Is it the library kernel's copies of 16 rows (a position's heads; the probe copies 64 rows at
# once)?
#
#   bash scripts/gpu_session61.sh copies      # the probe's best configuration with 4 copies of 16
#                                             # rows a step, against 1 copy of 64 and Triton
#
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session61.sh STEP}"

# scripts/gpu_gluon_bwd_probe.py's configurations in the order given, each in a process of its own
bwd_probe() {
    local i
    for i in "$@"; do
        timeout 100 python scripts/gpu_gluon_bwd_probe.py --configs "$i" 2>&1 | grep -v "^device" \
            | tee -a "$OUT/gluon_bwd_probe_h200.txt"
        [ "${PIPESTATUS[0]}" -eq 124 ] && echo "config $i: timed out (100 s)" | tee -a "$OUT/gluon_bwd_probe_h200.txt"
    done
}
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
