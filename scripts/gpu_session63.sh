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
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
