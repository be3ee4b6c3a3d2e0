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
# Its GPU tests pass (14 with the compressed one's); the kernel 10.92-10.94 ms at 64k against the Triton
# kernel's 12.43-12.50 (1.14x), 1.28-1.29 against 1.48-1.49 at 8k; the whole 64k forward+backward
# 92.30-92.62 ms against 92.61-93.81 (ABBA), 8k 6.91-7.04 against 7.02-7.22. Prefill with it on:
# 64k 32.84 / 117.4 ms (3.57x) forward, 92.33 / 448.6 (4.86x) forward+backward; 8k 0.88x and 1.10x.
#
# Its copy warp waited, each step, for the step's positions, then for their row vectors: two loads'
# round trips against a step's computing of about one. Loaded two and one steps ahead instead (main;
# the first form exported to .variants63/sel_first.py for the call):
#
#   bash scripts/gpu_session63.sh prefetch    # the GPU tests; the two forms in one process at 64k and
#                                             # 8k (gluon_dkdv_variants); its queries a program (512,
#                                             # 1024, 2048) at 64k
#
# The 7 GPU tests pass; loaded ahead, the kernel 11.11-11.12 ms at 64k against the first form's
# 10.89-10.93 (ptxas spills more), the step no faster: the copy warp is not what holds it; reverted.
# QSEG 512, 1024 (the default) and 2048: the same within noise (11.08-11.25 ms).
#
# Two programs an SM at 232 registers, 2 ring slots, have their wgmma serialised (C7512, 136 bytes
# spilled). One program an SM at 168 (the computing warpgroup 256) with 3 or 4 slots compiles without
# C7512 (24 bytes spilled, 170 KiB with 4), exported to .variants63/ring3.py and ring4.py:
#
#   bash scripts/gpu_session63.sh ring        # the two against main in one process at 64k and 8k;
#                                             # the serialisation test with the kernel on
#
# Bitwise the same gradients as main. 64k, the kernel: main (two an SM) 10.86-10.93 ms, 3 slots
# 10.09-10.16, 4 slots 9.95-9.97 (1.25x the Triton kernel's 12.43-12.50); the whole forward+backward
# 90.78-91.58, 90.14-90.89, 90.32-90.83; 8k the kernel 1.30, 1.15, 1.13-1.14. The serialisation test
# failed on main's form (C7512 at 128 registers, 8 warps), as expected. Into main: 4 slots, one an
# SM, and NSA_GLUON_SELECTED_DKDV on by default:
#
#   bash scripts/gpu_session63.sh land        # the GPU tests of the ops (the serialisation test among
#                                             # them), the layer and varlen on 8 workers
#   bash scripts/gpu_session63.sh tables      # nsa-bench prefill (8k-64k) and decode (batch 1-64)
#
# 411 GPU tests pass (ops with the serialisation test, the layer, varlen). Prefill at e845a12: 64k
# 32.35 / 118.9 ms (3.68x) forward, 90.54 / 448.1 (4.95x) forward+backward; 8k 0.88x and 1.13x. Decode
# at 64k 19.14 / 49.17 us (2.57x) at batch 1, 71.14 / 482.4 (6.78x) at batch 16.
#
# The selected kernel gained most from one program an SM whose warpgroup has 256 registers and no
# serialised wgmma. The compressed dK/dV likewise: one computing warpgroup a program, two programs a
# token tile of 128 (each copies its query tiles), 176 KiB, no C7512 (main at 3573ba1, now branch
# next/gluon-dkdv-one-warpgroup; session 62's two warpgroups exported to .variants63/two_wg.py):
#
#   bash scripts/gpu_session63.sh onewg       # the compressed Gluon tests; the two forms at 64k in one
#                                             # process; nsa-bench prefill
#
# The 7 tests pass, the gradients bit for bit the two warpgroups'; but the kernel 21.61-21.67 ms against
# 17.81-17.82, the whole forward+backward 92.45-92.90 against 89.73-90.11 in all four rounds: the two
# warpgroups' shared query tiles are worth more than ptxas's unserialised products. Reverted (846783d);
# the prefill table of this call (64k 92.75 / 445.9 ms) is of the dropped form.
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
    gluon_tests 300 tests/ops/test_gluon_selected_dkdv.py tests/ops/test_gluon_dkdv.py
    probe_run 260 gluon_selected_dkdv --lengths 65536 8192 --only gluon_selected_dkdv
    NSA_GLUON_SELECTED_DKDV=1 h200_prefill
    ;;
prefetch)
    gluon_tests 300 tests/ops/test_gluon_selected_dkdv.py
    export NSA_GLUON_SELECTED_DKDV=1
    # shellcheck disable=SC2046
    probe_run 250 selected_variants --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch selected \
        $(variant_args)
    probe_run 150 selected_qseg --lengths 65536 --only gluon_selected_qseg
    ;;
ring)
    export NSA_GLUON_SELECTED_DKDV=1
    # shellcheck disable=SC2046
    probe_run 280 selected_rings --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch selected \
        $(variant_args)
    timeout 300 python -m pytest -q -p no:cacheprovider --gpu-profile auto -rs --tb=short \
        tests/ops/test_wgmma_serialisation.py 2>&1 | tail -8
    ;;
land)
    worker_tests 400 "$(git rev-parse --short HEAD 2>/dev/null || echo session63)" tests/ops tests/test_module.py \
        tests/test_varlen.py
    tar_reports
    ;;
tables)
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
onewg)
    gluon_tests 150 tests/ops/test_gluon_dkdv.py
    # shellcheck disable=SC2046
    probe_run 130 compressed_onewg --lengths 65536 --only gluon_dkdv_variants $(variant_args)
    h200_prefill
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
