#!/usr/bin/env bash
# The GPU calls of session 63 (H200). Session 62 left three versions of the Gluon dK/dV compiled
# offline on branches, none run: `next/gluon-dkdv-unmasked` (the visibility mask only on masked
# tiles), `next/gluon-dkdv-4slots` (4 ring slots, one dS buffer a warpgroup) and
# `next/gluon-dkdv-both`; and a probe of a persistent warp-specialised loop on the window's band.
# Each branch's gluon_dkdv.py is exported to .variants63/ (untracked, deleted after the call) and
# put in place of main's in one process (gpu_prefill_probe.py's `gluon_dkdv_variants`).
#
#   bash scripts/gpu_session63.sh variants    # the three versions' gradients against main's, then
#                                             # the 64k and 8k forward+backward (ABBA) and kernel
#                                             # lists; then gpu_gluon_band_probe.py, each of its
#                                             # configurations in a process of its own
#
# All three versions give main's gradients bit for bit. 64k, the kernel / the whole forward+backward
# (ms): main 19.10-19.18 / 93.56-94.10, 4 slots 17.95-18.05 / 93.24-93.49, both 18.21-18.28 /
# 93.08-93.38, the mask only where needed 19.64-19.69 / 94.40-94.57; 8k 0.431-0.434 against 0.405-0.410
# (4 slots). Into main: 4 slots. The band probe: Triton's plain loop 0.727 ms (378 TFLOP/s) at 64 rows,
# the Gluon loop one program a tile 0.705-0.745, persistent 0.613-0.660 (448 TFLOP/s at one an SM,
# 128-key steps): 1.19x.
#
# The selected branch's dK/dV in Gluon (new, nsa/ops/selected/gluon_dkdv.py: a copy warp, one
# computing warpgroup, two programs an SM), flag NSA_GLUON_SELECTED_DKDV:
#
#   bash scripts/gpu_session63.sh selected    # its GPU tests and the compressed one's (4 slots); then
#                                             # the flag off/on at 64k and 8k (ABBA, kernel lists);
#                                             # then nsa-bench prefill with it on
#
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session63.sh STEP}"

# --dkdv-variant arguments for every .variants63/LABEL.py
variant_args() {
    local f
    for f in .variants63/*.py; do
        [ -f "$f" ] && printf -- '--dkdv-variant %s=%s ' "$(basename "$f" .py)" "$f"
    done
}

device_line
case "$step" in
variants)
    # shellcheck disable=SC2046
    probe_run 330 dkdv_variants --lengths 65536 8192 --only gluon_dkdv_variants $(variant_args)
    for i in 0 1 2 3 4 5 6 7; do
        timeout 60 python scripts/gpu_gluon_band_probe.py --configs "$i" 2>&1 | grep -v "^device" \
            | tee -a "$OUT/gluon_band_probe_h200.txt"
    done
    ;;
selected)
    timeout 300 python -m pytest -q -p no:cacheprovider --gpu-profile auto -rs --tb=short \
        tests/ops/test_gluon_selected_dkdv.py tests/ops/test_gluon_dkdv.py 2>&1 | tee "$OUT/gluon_tests.txt" | tail -15
    grep -q " failed\| error" "$OUT/gluon_tests.txt" && { echo "== tests failed: no timing"; exit 1; }
    echo "== tests after $(( $(date +%s) - start )) s"
    probe_run 260 gluon_selected_dkdv --lengths 65536 8192 --only gluon_selected_dkdv
    NSA_GLUON_SELECTED_DKDV=1 h200_prefill
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
