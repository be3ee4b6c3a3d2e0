#!/usr/bin/env bash
# The GPU calls of session 62 (H200). Session 61 left the Gluon dK/dV kernels with their wgmma
# serialised by ptxas for want of registers (C7512). With the gradient products' A operands (P^T
# and dS^T) taken from shared memory instead of registers, both compile for sm_90 without C7512.
# Does that make the probe's step faster, and the library kernel faster than Triton's in place?
#
#   bash scripts/gpu_session62.sh dsout6      # scripts/gpu_gluon_bwd_probe.py: Triton (config 0)
#                                             # and session 61's best Gluon form (24) around the
#                                             # shared-memory A operands (27-30: 2 or 3 slots, 1 or
#                                             # 4 copies); then the library kernel (branch
#                                             # next/gluon-dkdv rebased on main, exported to
#                                             # .branch62/ for the call) through session 61's
#                                             # `gluon` step; then the GPU test that no library
#                                             # kernel has its wgmma serialised
#
# Probe, ms for 4.4 TFLOP: Triton 10.43 (twice), DS_OUT 5 (session 61's best) 8.78-8.89, the
# shared-memory A operands 8.95 / 9.07 in 2 slots (1 / 4 copies), 9.31 / 9.38 in 3: no faster. The
# library kernel (5 GPU tests pass) 28.16-28.19 ms at 64k against Triton's 22.04-22.33, the step
# 100.9-101.5 against 96.5-97.5: slower than session 61's form (25.2). C7512 is not what held it.
#
# That test found one: the compressed forward's pass 1 (128 rows of 8 warps, 64-token tiles capped
# at 128 registers, session 57's) has its wgmma serialised for want of registers (C7512). Is a
# launch without C7512 faster now that pass 1 reads its tiles through descriptors?
#
#   bash scripts/gpu_session62.sh pass1       # gpu_prefill_probe.py --only pass1_serial at 64k and
#                                             # 32k (the default against 32- and 16-token tiles at 128
#                                             # registers and 64-token tiles at 144 and 168, two
#                                             # rounds; a faster one in the whole step, ABBA); then
#                                             # nsa-bench prefill (8k-64k) and decode (batch 1-64)
#
# Every launch without C7512 slower: 64k 15.94-16.15 ms against 16.91-17.81 (32-token tiles),
# 22.71 (16-token), 17.63-17.72 (64-token tiles at 144 or 168 registers); 32k 4.37 against 4.60-6.01.
# Prefill 64k 33.00 / 119.1 ms (3.61x) forward, 97.26 / 453.5 (4.66x) forward+backward, 8k 0.91x and
# 1.07x; decode at 64k 19.07 / 49.58 us (2.60x) at batch 1, 71.65 / 492.4 (6.87x) at batch 16.
#
# The serialisation test with pass 1 as its one measured exception; and pass 1's own rate: is
# there room for the specialised Gluon loop (549-607 TFLOP/s in session 61's probe)?
#
#   bash scripts/gpu_session62.sh rate        # tests/ops/test_wgmma_serialisation.py, then
#                                             # gpu_prefill_probe.py --only pass1_rate at 64k and 32k
#
# Is it the programs' length? The library's dK/dV at 64k runs 4096 programs of about 256 steps on
# average (uneven), the probe 1024 of 512. The same rows in 16 and 32 chunks a key tile:
#
#   bash scripts/gpu_session62.sh chunks      # configurations 0 (Triton) and 24 (Gluon, DS_OUT 5)
#                                             # at 8, 16 and 32 chunks (512, 256, 128 steps)
#
# No: 1.17-1.20x at 8, 16 and 32 chunks (Gluon 8.80-8.99 ms, Triton 10.43-10.65). What the library
# kernel adds to the probe's step is its row vectors (lse, delta, gate) and dS offsets, read from
# global memory after each wait, on the computing warpgroups' path. Staged in shared memory by the
# copy warp instead (branch next/gluon-dkdv, exported to .branch62/ for the call):
#
#   bash scripts/gpu_session62.sh rowvec      # the branch's GPU tests and its flag off/on at 64k
#                                             # and 8k (session 61's `gluon` step)
#
# The kernel 19.53-19.54 ms at 64k against the Triton kernel's 21.84-21.91 (1.12x), 0.431 against
# 0.502-0.511 at 8k (1.17x); the whole 64k forward+backward 94.17-94.68 ms against 96.31-96.67 in
# all four ABBA rounds, the 8k one the same; the 5 GPU tests pass. Into main, on by default:
#
#   bash scripts/gpu_session62.sh land        # the GPU tests of the ops, the layer and varlen on 8
#                                             # workers (the Gluon dK/dV on by default), the
#                                             # serialisation test; then nsa-bench prefill (8k-64k)
#
# 403 GPU tests pass with it on; the serialisation test failed on the Gluon kernel's warp count (12,
# as Triton counts its partitions, not 4), since fixed. Prefill 64k 32.24 / 116.4 ms (3.61x) forward,
# 92.92 / 443.7 (4.78x) forward+backward; 8k 2.189 / 1.927 (0.88x), 7.05 / 7.416 (1.05x).
#
# The probe's step lost 8 % to its rows in 4 copies of 16 (session 61). One 3D box a tile instead
# ([positions, heads, D] of q and do; branch next/gluon-dkdv, exported to .branch62/):
#
#   bash scripts/gpu_session62.sh box         # the serialisation test again (main's tree), then the
#                                             # branch's Gluon tests and its flag off/on at 64k
#
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session62.sh STEP}"

device_line
case "$step" in
dsout6)
    bwd_probe 0 24 27 28 29 30 24 0
    echo "== probe after $(( $(date +%s) - start )) s"
    if [ -d .branch62 ]; then
        OUT="$OUT/branch" bash .branch62/scripts/gpu_session61.sh gluon
        echo "== branch after $(( $(date +%s) - start )) s"
    fi
    timeout 400 python -m pytest -q -p no:cacheprovider --gpu-profile auto -rs --tb=short \
        tests/ops/test_wgmma_serialisation.py 2>&1 | tail -15
    ;;
pass1)
    probe_run 300 pass1_serial --lengths 65536 32768 --only pass1_serial
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
rate)
    timeout 400 python -m pytest -q -p no:cacheprovider --gpu-profile auto -rs --tb=short \
        tests/ops/test_wgmma_serialisation.py 2>&1 | tail -6
    probe_run 200 pass1_rate --lengths 65536 32768 --only pass1_rate
    ;;
chunks)
    for chunks in 8 16 32; do
        for i in 0 24 24 0; do
            timeout 100 python scripts/gpu_gluon_bwd_probe.py --chunks "$chunks" --configs "$i" 2>&1 | grep -v "^device" \
                | sed "s/^/chunks $chunks: /" | tee -a "$OUT/gluon_bwd_chunks_h200.txt"
        done
    done
    ;;
rowvec)
    OUT="$OUT/branch" bash .branch62/scripts/gpu_session61.sh gluon
    ;;
land)
    worker_tests 330 "$(git rev-parse --short HEAD 2>/dev/null || echo session62)" tests/ops tests/test_module.py \
        tests/test_varlen.py
    tar_reports
    h200_prefill
    ;;
box)
    timeout 300 python -m pytest -q -p no:cacheprovider --gpu-profile auto -rs --tb=short \
        tests/ops/test_wgmma_serialisation.py 2>&1 | tail -4
    GLUON_LENGTHS=65536 OUT="$OUT/branch" bash .branch62/scripts/gpu_session61.sh gluon
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
