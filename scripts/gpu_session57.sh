#!/usr/bin/env bash
# The GPU calls of session 57 (H200). The compressed dK/dV kernel (21.4 ms of the 64k
# forward+backward, its longest kernel) stores every (query tile, token tile) pair's dS for the dQ:
# 16.5 GiB at 64k. Compiled for sm_90 each step's store is the threads' own: the tile to shared
# memory, a barrier, back to registers, then 16-byte global stores (session 19: on an H100 at 8k the
# kernel took 0.509 ms with the stores against 0.414 without). Each tile's rows are contiguous in
# the buffer, so one tensor-descriptor (TMA) copy can store it from shared memory: 608 instructions
# a step against 630, no stack (16 bytes before). compressed.kernel.DS_STORE["bulk"] (new, off):
#
#   bash scripts/gpu_session57.sh bulk REV    # the compressed backward with either store (ABBA, bitwise
#                                             # checked), its kernels with either and without the dS
#                                             # buffer, the whole forward+backward (ABBA) and its
#                                             # kernels (8k, 64k); the compressed GPU tests (report
#                                             # named after REV) (ran at e03b6ae)
#
# Bitwise the same results, but no faster: the compressed backward alone 27.94-28.13 ms at 64k against
# 28.24-28.33 (ABBA), its dK/dV kernel 22.51 against 22.37 in the profiler; the whole forward+backward
# 97.25-97.96 flushed against 97.11-97.86; 8k the same within 0.01 ms. Without the dS buffer the dK/dV
# takes 18.57 ms (8k 0.412 against 0.504): the stores cost 3.8 ms of it, but not in instructions. The
# GPU tests passed (27). One guess is L2: 16.5 GiB of dS written through it while the programs of a
# query chunk share their q and do tiles there. The stores marked evict-first (DS_STORE["eviction"]),
# then the prefill table at the default:
#
#   bash scripts/gpu_session57.sh evict       # ds_bulk again with the evict-first stores as a third
#                                             # variant (64k, 8k); nsa-bench prefill (8k-64k, dense in
#                                             # the same run) (ran at 9f0b258; the probe section ds_bulk
#                                             # is on the branch next/ds-store)
#
# The evict-first stores no faster either: the compressed backward 27.63-27.80 ms against 27.71-27.90
# (bulk copies 27.63-27.79), the whole forward+backward 96.69-97.15 flushed with any of the three; 8k
# the same. The prefill table at 9f0b258 (the default stores): 8k 2.184 / 1.824 ms (0.84x) and 7.088 /
# 7.487 (1.06x); 64k 34.01 / 117.6 (3.46x) and 96.73 / 447.9 (4.63x). Both options dropped.
#
# The dQ from dS (4.9 ms at 64k) reads 16.5 GiB of dS from DRAM, about 3.4 TB/s, and with each 8 KiB
# dS tile a 16 KiB K tile from L2. A program of QT query tiles loads each K tile once for all of them
# (compressed_bwd_dq_ds_kernel's QT, DQ_DS_TILES["query_tiles"], new):
#
#   bash scripts/gpu_session57.sh dqds REV    # the compressed backward by the dQ's launch (tokens a
#                                             # step, warps, stages, query tiles), each with its kernel
#                                             # list; the fastest against the default in the whole
#                                             # forward+backward (ABBA) and its kernels (64k, 8k); the
#                                             # compressed GPU tests (report named after REV) (ran at
#                                             # 4ede740)
#
# dq bitwise the same for every launch. The kernel alone (profiler) at 64k: 4.63 ms for two query tiles
# in 8 warps against 5.23 for one (the default), 4.65 in 4 warps, 5.00 for four tiles; 8k 0.128-0.130
# against 0.141. The whole 64k forward+backward with two tiles (ABBA, flushed) 98.48-98.88 ms against
# 97.99-99.91 (shorter in three rounds of four), back to back 97.85-98.97 against 99.71-100.1; 8k the
# same within noise. Two tiles in 8
# warps are the default now where the dK/dV's Hopper tiles apply (DQ_DS_HOPPER_TILES); the bulk-copy
# and evict-first stores left main (branch next/ds-store, docs/perf/attempts/prefill_compressed_ds_store.patch).
# The tables at the final code, and the GPU tests of the files that run the compressed backward:
#
#   bash scripts/gpu_session57.sh final REV   # nsa-bench prefill (8k-64k), nsa-bench decode (batch
#                                             # 1-64, graph replay), dense in the same runs; the
#                                             # compressed, select and nsa_attention GPU tests (report
#                                             # named after REV) (ran at e5ed846)
#
# Prefill: 8k 2.188 / 1.847 ms (0.84x) and 7.145 / 7.546 (1.06x); 64k 33.48 / 116.9 (3.49x) and 97.17 /
# 448.0 (4.61x). Decode at 64k: batch 1 18.91 / 50.50 us (2.67x), batch 16 71.86 / 494.4 (6.88x). The
# GPU tests passed (104, 4 skipped). The dQ's gain came from L2: two query tiles share each K tile.
# Pass 1 of the compressed forward (where pass 2 runs apart) loads 32 KiB of K and V from L2 a step
# for 64 rows; in 128-row tiles at two programs an SM each load serves twice the rows:
#
#   bash scripts/gpu_session57.sh pass1wide   # pass 1 by its launch (128 rows of 8 warps in 32-token
#                                             # tiles, or 64-token tiles capped at 128 registers),
#                                             # against the default; the fastest in the whole forward
#                                             # and forward+backward (ABBA) and the kernel lists (64k,
#                                             # 32k) (ran at 035a10d)
#
# In 64-token tiles capped at 128 registers (two programs of 8 warps an SM), bitwise the same results:
# the compressed forward with selection 16.37-16.49 ms at 64k against 17.15-17.34, 32k 4.44 against
# 4.65-4.70; the whole 64k forward 33.18-33.50 against 33.81-34.29 (ABBA, flushed), forward+backward
# 97.19-97.62 against 97.41-99.12; 32k forward 12.59-12.63 against 12.84-12.85. 32-token tiles no
# faster (17.17-17.46). The capped tiles are pass 1's default now (PASS2_APART["pass1"]). The prefill
# table at that code (the decode kernels did not change since the final step) and the GPU tests of
# the files that run the compressed forward:
#
#   bash scripts/gpu_session57.sh table2 REV  # nsa-bench prefill (8k-64k, dense in the same run); the
#                                             # select, compressed and nsa_attention GPU tests (report
#                                             # named after REV) (ran at 325d814)
#
# Prefill: 8k 2.179 / 1.833 ms (0.84x) and 7.091 / 7.493 (1.06x); 64k 32.44 / 116.6 (3.59x) and 95.44 /
# 445.7 (4.67x), the H200's highest ratios at 64k so far. The GPU tests passed (104, 4 skipped). The
# prefill table once more, on another machine:
#
#   bash scripts/gpu_session57.sh table3      # nsa-bench prefill (8k-64k, dense in the same run) (ran
#                                             # at 0db1fb5)
#
# 32.81 / 117.5 ms (3.58x) and 96.44 / 446.0 (4.62x) at 64k; 8k 0.90x and 1.06x. With the last device
# minutes, Nsight Compute on the compressed dK/dV with and without its dS stores (they cost it 3.8 of
# 22.4 ms at 64k, and neither bulk copies nor evict-first stores changed that):
#
#   bash scripts/gpu_session57.sh ncu         # ncu (warp states, throughput, memory sections) on the
#                                             # dK/dV kernel at 16k, dS stored or not (ran at c57b206)
#
# ncu read the counters (Firecracker). With the stores 1.63 ms against 1.36: 1.20 times, from 1.09
# times the instructions (630 a step against 576) and 1.10 times the cycles per issued instruction
# (6.76 against 6.17). DRAM 24 % against 11 %, L2 35 % against 21 %, neither near its limit; 12.5 %
# occupancy (one program of 8 warps an SM) both ways.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session57.sh bulk REV | evict | dqds REV | final REV | pass1wide | table2 REV | table3 | ncu}"
device_line

case "$step" in
bulk)
    rev="${2:?the bulk step needs the commit to name the test report after}"
    probe_run 330 ds_bulk --lengths 65536 8192 --only ds_bulk --kernels 8
    reported_tests 200 "$rev" tests/ops/test_compressed_kernel.py
    ;;
evict)
    probe_run 300 ds_bulk --lengths 65536 8192 --only ds_bulk --kernels 8
    h200_prefill
    ;;
dqds)
    rev="${2:?the dqds step needs the commit to name the test report after}"
    probe_run 360 dq_ds_tiles --lengths 65536 8192 --only dq_ds_tiles --kernels 6
    reported_tests 150 "$rev" tests/ops/test_compressed_kernel.py
    ;;
final)
    rev="${2:?the final step needs the commit to name the test report after}"
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    reported_tests 200 "$rev" tests/ops/test_compressed_kernel.py tests/ops/test_select_kernel.py \
        tests/ops/test_nsa_attention_kernel.py
    ;;
pass1wide)
    probe_run 420 pass1_wide --lengths 65536 32768 --only pass1_wide --kernels 8
    ;;
table2)
    rev="${2:?the table2 step needs the commit to name the test report after}"
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    reported_tests 200 "$rev" tests/ops/test_select_kernel.py tests/ops/test_compressed_kernel.py \
        tests/ops/test_nsa_attention_kernel.py
    ;;
table3)
    h200_prefill
    ;;
ncu)
    for ds in on off; do
        timeout 100 ncu --profile-from-start off --clock-control none -k regex:compressed_bwd_dkdv_kernel \
            --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
            python scripts/ncu_compressed_bwd.py --length 16384 --ds "$ds" > "$OUT/ncu_dkdv_ds_$ds.txt" 2>&1
        echo "== ncu dS $ds: rc $? after $(( $(date +%s) - start )) s"
        grep -E "Duration|Stall|Throughput|Warp Cycles|Issued|L2 Hit|Mem Busy|Registers" "$OUT/ncu_dkdv_ds_$ds.txt" | head -40
    done
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
