#!/usr/bin/env bash
# The GPU calls of session 60 (H200). On the H200 (session 53) the kernels of one 64k
# forward+backward added up to 94.6 ms where the table's call took 98.3: is a twentieth of the
# step idle between kernels?
#
#   bash scripts/gpu_session60.sh timeline    # scripts/gpu_prefill_timeline.py (new): the table's
#                                             # timing beside a profiled timeline of the same calls,
#                                             # 8k and 64k, forward and forward+backward (ran at
#                                             # bf5f4c3, the script not yet committed, with a
#                                             # call splitter since fixed)
#
# No: the device is busy 99.9 % of every call but the first (idle 0.03-0.11 ms a call; the median
# gap between kernels 1.2-1.3 us), the allocator made no device allocation, and the table's 64k
# forward+backward took 95.10 ms beside 95.5-95.9 ms of kernels a profiled call. Session 53's 94.6
# and 98.3 came from two runs (the profiler's and the table's). Nothing to win between the kernels.
#
# The window kernels run at about half of cuDNN's dense rate; each program walks only the 9 key
# tiles of its band. scripts/gpu_window_flat_probe.py (new) asks whether the short loops are the
# cost, and whether a loop over several query tiles (flattened, so that the next tile's keys are
# prefetched while a tile ends) wins it back:
#
#   bash scripts/gpu_session60.sh flat        # sections long (the library at W = 512, 2048, 4096),
#                                             # flat (the flattened loop), one (the band in one
#                                             # loop instead of three), parts (where a program's
#                                             # fixed cost goes) (ran in four direct calls at
#                                             # bf5f4c3, the probe not yet committed, as it grew)
#
# Long loops are faster: the library's window forward runs at 294-295 TFLOP/s of useful work at
# W = 512, 380-393 at 2048 and 402-409 at 4096; walking each band twice costs 3.23 ms more at 64k
# where the whole kernel takes 3.96: a fixed cost of about a fifth a program, of which the stores
# are 3-4 % and the query rows' reads 0-4 %. Neither loop form wins it back: the band in one loop
# 0.92-1.04x the library, the flattened loop over 16 query tiles 0.95-0.98x at best (query rows in
# registers; through the pipeline 0.83-0.86x). The first flattened forms ran at 0.47-0.86x because
# ptxas serialised every wgmma of the kernel (notes C7515, then C7514: a write of the accumulator
# inside the loop, then a read of it after the next product's issue): the fixed form avoids both
# and is bitwise the library's output.
#
# Nor does an offset between an SM's two programs: the first wave's odd programs, or its second
# half, held back 4 or 8 us (section stagger, one more direct call) left the kernel's time as it was
# (0.91-0.92x the library at 8k, 0.94-0.96x at 64k, as the same loop unheld).
#
#   bash scripts/gpu_session60.sh ptxas       # scripts/gpu_ptxas_notes.py (new): the library's
#                                             # prefill (8k, 20k, 64k) and decode (batch 1, 16 at
#                                             # 64k) compiled in a fresh Triton cache, every kernel's
#                                             # PTX through ptxas -v again (ran at bf5f4c3,
#                                             # the script not yet committed)
#
# 32 compiled kernels, none with a serialisation note. Spills: the window dK/dV's 724 bytes stored
# and 988 loaded are outside its loops (0-2 local loads a loop, sm_90 compile).
#
# A GPU test keeps it so (tests/ops/test_wgmma_serialisation.py, new: the library's Hopper launches
# compiled in a fresh Triton cache, prefill at 8k and 20k, decode at batch 1 and 16, no C7514/C7515):
#
#   bash scripts/gpu_session60.sh wgmma       # that test under --gpu-profile auto (ran at c56940d
#                                             # with the test uncommitted)
#
# Passed, in 66 s.
#
# Gluon (Triton's lower-level language, in Triton 3.6) exposes the wgmma's asynchronous issue and
# wait: can an attention loop overlap a tile's exponentials with the next tile's score product, as
# hand-written Hopper kernels do?
#
#   bash scripts/gpu_session60.sh gluon       # scripts/gpu_gluon_probe.py (new): the loop of
#                                             # gpu_ws_probe.py's shape in Gluon, TMA into a ring of
#                                             # slots, with and without the overlap, each
#                                             # configuration in a process of its own under a
#                                             # timeout; Triton's loops timed beside (ran at
#                                             # 57bf9b0 with the probe uncommitted)
#
# The first call ran every configuration in one process and hung at the first overlapped one (two
# slots: the next tile's copy was never issued; the kernel now asserts three), holding the GPU until
# the call's 500-s limit. Then, TFLOP/s: the best Gluon loop, 128 rows of 4 warps in 2 stages,
# 527.9, beside Triton's same tile by descriptors 518.9 and by pointers 493.5; overlapped, 64 rows
# 456.7 against 475.5-476.8 plain, 128 rows of 8 warps 448.6 against 443.7 plain (64-key tiles),
# and 500.5 with 128-key tiles (not timed plain). The overlap as written does not pay, and Gluon's
# plain loop gains 2 % on Triton's.
#
#   bash scripts/gpu_session60.sh final       # nsa-bench prefill (8k-64k) and decode (batch 1-64),
#                                             # then the timeline again with the fixed splitter (ran
#                                             # at 57bf9b0, between the flat and stagger calls)
#
# Prefill 64k 32.58 / 118.9 ms (3.65x) forward, 96.04 / 455.4 (4.74x) forward+backward, 8k 0.80x
# (2.183 / 1.755) and 1.07x; decode at 64k 19.02 / 49.01 us (2.58x) at batch 1, 70.94 / 481.9 (6.79x)
# at batch 16, 7.63x at 32, 7.88x at 64. The timeline: 4 calls, 0.11 ms idle each.
#
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session60.sh STEP}"
device_line
case "$step" in
timeline)
    timeout 400 python scripts/gpu_prefill_timeline.py --lengths 8192 65536 --calls 4 --forward 2>&1 \
        | grep -v Warning | tee "$OUT/prefill_timeline_h200.txt" | tail -40
    ;;
flat)
    timeout 500 python scripts/gpu_window_flat_probe.py --lengths 8192 65536 --only long flat one parts stagger 2>&1 \
        | tee "$OUT/window_flat_probe_h200.txt" | tail -60
    ;;
ptxas)
    timeout 500 python scripts/gpu_ptxas_notes.py --lengths 8192 20480 65536 --batches 1 16 2>&1 \
        | grep -v Warning | tee "$OUT/ptxas_notes_h200.txt" | tail -40
    ;;
gluon)
    for i in 2 8 7 12 14 15 1 11 16 0 5; do
        timeout 45 python scripts/gpu_gluon_probe.py --configs "$i" 2>&1 | grep -v "^device" | tee -a "$OUT/gluon_probe_h200.txt"
        [ "${PIPESTATUS[0]}" -eq 124 ] && echo "config $i: timed out (45 s)" | tee -a "$OUT/gluon_probe_h200.txt"
    done
    ;;
wgmma)
    timeout 280 python -m pytest -q -rs -p no:cacheprovider --gpu-profile auto tests/ops/test_wgmma_serialisation.py \
        2>&1 | tail -6
    ;;
final)
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    timeout 300 python scripts/gpu_prefill_timeline.py --lengths 65536 --calls 4 2>&1 \
        | grep -v Warning | tee "$OUT/prefill_timeline_64k_h200.txt" | tail -30
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
