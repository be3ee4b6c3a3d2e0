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
# No: the device is busy 99.9 % of every call but the first (idle 0.03-0.08 ms a call; the median
# gap between kernels 1.2-1.3 us), the allocator made no device allocation, and the table's 64k
# forward+backward took 95.10 ms beside 95.9 ms of kernels. Session 53's 94.6 and 98.3 came from
# two different runs. Nothing to win between the kernels.
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
# are 3 % and the query rows' reads nothing. Neither loop form wins it back: the band in one loop
# 0.92-1.04x the library, the flattened loop over 16 query tiles 0.95-0.98x at best (query rows in
# registers; through the pipeline 0.83-0.86x). The first flattened forms ran at 0.5-0.86x because
# ptxas serialised every wgmma of the kernel (notes C7515, then C7514: a write of the accumulator
# inside the loop, then a read of it after the next product's issue): the fixed form avoids both
# and is bitwise the library's output.
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
#   bash scripts/gpu_session60.sh final       # nsa-bench prefill (8k-64k) and decode (batch 1-64),
#                                             # then the timeline again with the fixed splitter
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
    timeout 500 python scripts/gpu_window_flat_probe.py --lengths 8192 65536 --only long flat one parts 2>&1 \
        | tee "$OUT/window_flat_probe_h200.txt" | tail -60
    ;;
ptxas)
    timeout 500 python scripts/gpu_ptxas_notes.py --lengths 8192 20480 65536 --batches 1 16 2>&1 \
        | grep -v Warning | tee "$OUT/ptxas_notes_h200.txt" | tail -40
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
