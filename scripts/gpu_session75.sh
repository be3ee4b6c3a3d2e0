#!/usr/bin/env bash
# The GPU calls of session 75 (H200). The compressed forward's scoring pass stores two planes of block
# masses a row (plane 1: the halves of the compressed tokens that straddle into the next block), and
# the top-n reads both: 2 x 4 KiB a row on average at 64k, about 1 GB each way in 8 chunks. How much
# of the scoring pass and the top-n goes to the second plane? (Little; Nsight Compute then showed the
# top-n waiting on its own loads, and the top-n now reads its rows in whole 16-block pieces, on one warp
# up to 1024 blocks: 1.35 ms against 1.56 at 64k.)
#
#   bash scripts/gpu_session75.sh planes      # the probe's section scores_planes at 64k and 8k: each
#                                             # chunk's scoring pass with two planes and with one, the
#                                             # top-n on two planes and on their sum, and on chunks
#                                             # twice as long
#
# 64k (8 launches, ms, two rounds): the scoring pass 4.924-4.931 with two planes, 4.756-4.763 with one
# (timing only); the top-n 1.562-1.563 on two, 1.532-1.533 on their sum, 1.518-1.519 on 4 chunks of
# 16384 queries. 8k: 0.127 against 0.122, 0.049 against 0.046. At most 0.2 ms: not built.
#
#   bash scripts/gpu_session75.sh layers      # one layer's decode step inside a graph of 8 chained
#                                             # layers (scripts/gpu_decode_layers.py; session 24 ran
#                                             # it on the H100), batch 1 and 16, 8k and 64k
#
# Batch 1 at 64k: 16.7 us a layer (15.9 with the flush that leaves nothing dirty) against dense's 41.3
# (40.1), 2.48x (2.52x); one layer alone 20.3 against 50.9. Batch 16 at 64k 62.3 against 486.1 (7.81x).
#
#   bash scripts/gpu_session75.sh topn_ncu    # Nsight Compute on one top-n launch of the 64k forward's
#                                             # last chunk (scripts/ncu_topn.py): the full set, and
#                                             # the SASS with each instruction's stall samples
#
# 280 us, 2.81 instructions a cycle an SM, 72 registers (7 warps a scheduler); 41 % of the stall
# samples on reading each row (32 scalar loads issued two at a time, each pair waited for), 38 % on
# the radix rounds (20.2 a row).
#
#   bash scripts/gpu_session75.sh aligned     # the top-n reading its planes aligned in 16-block pieces
#                                             # (the writers storing plane s at the block it lands in):
#                                             # the selection GPU tests; the probe's section
#                                             # topn_aligned at 64k and 8k (each chunk against the saved
#                                             # kernel before, the same blocks; the forward's kernels)
#
# Run with scripts/_old_block_topn.py = git show 0cb142f:src/nsa/ops/_triton/block_topn.py. Tests: 53
# passed. 64k: 1.436, 1.434 ms against 1.559, 1.559, the same blocks (8k 0.047-0.048 against 0.048);
# in the forward's kernel lists the top-n 1.482 ms of 29.50.
#
#   bash scripts/gpu_session75.sh table       # the prefill table (its plot drawing the baseline), then
#                                             # the GPU tests of pass 1, the NSA prefill, the compressed
#                                             # kernels and the wgmma check
#
# At 0ceeceb: 8k forward 2.111 / 1.945 ms (0.92x), forward+backward 6.177 / 7.548 (1.22x); 64k 30.06 /
# 117.5 (3.91x) and 85.16 / 446.6 (5.24x). Tests: 71 passed, 4 skipped; wgmma check passed.
#
#   bash scripts/gpu_session75.sh recheck     # the probe's sections scores_planes and topn_aligned and
#                                             # scripts/ncu_topn.py (without Nsight Compute) at 8k, after
#                                             # they were refactored onto ncu_range.scoring_setup
#
# All three ran (docs/perf/raw/session75_probe_refactor_check_h200.txt): the same blocks from both top-n
# forms and from the kernel before; 8k as before (the scoring pass 0.129-0.130 against 0.122 with one
# plane; the top-n 0.048 either way).
#
#   bash scripts/gpu_session75.sh warps       # the probe's section topn (one, two and four warps a row,
#                                             # each chunk of 64k) with the whole-piece reads
#
# Random masses, ms a chunk for 1 / 2 / 4 warps: rows of 1024 blocks 0.248 / 0.270-0.271 / 0.329-0.331
# (two warps was the default), of 512 0.135 / 0.165-0.166 / 0.219-0.220, of 256 0.077 / 0.110 / 0.166.
#
#   bash scripts/gpu_session75.sh onewarp     # rows of up to 1024 blocks on one warp (row_warps): the
#                                             # selection GPU tests, then the probe's topn_aligned at 64k
#                                             # (against the kernel of 0cb142f; the forward's kernels)
#
# Tests: 53 passed. 64k: 1.350, 1.350 ms against 1.561-1.565, the same blocks (chunks of 1024 blocks
# 0.238-0.246); in the forward's kernel lists the top-n 1.386 ms of 29.32.
#
#   bash scripts/gpu_session75.sh final       # the prefill table at the session's last code
#
# At b0b13a5 (another machine): 8k forward 2.108 / 1.708 ms (0.81x), forward+backward 6.134 / 7.426
# (1.21x); 64k 29.64 / 116.2 (3.92x) and 84.38 / 443.7 (5.26x).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
planes)
    probe_run 400 scores_planes --only scores_planes --lengths 65536 8192
    ;;
layers)
    timeout 500 python scripts/gpu_decode_layers.py --contexts 8192 65536 --batches 1 16 --layers 8 2>&1 \
        | tee "$OUT/decode_layers_h200.md"
    ;;
topn_ncu)
    timeout 300 ncu --profile-from-start off --clock-control none --set full --import-source yes -o /tmp/topn \
        python scripts/ncu_topn.py 2>&1 | tail -5
    ncu -i /tmp/topn.ncu-rep --page details --csv > "$OUT/topn_ncu_details.csv" 2>&1
    ncu -i /tmp/topn.ncu-rep --page source --csv --print-source sass > "$OUT/topn_ncu_sass.csv" 2>&1
    ncu -i /tmp/topn.ncu-rep --page raw --csv > "$OUT/topn_ncu_raw.csv" 2>&1
    wc -l "$OUT"/topn_ncu_*.csv
    grep -i "duration\|registers\|achieved occupancy\|theoretical occupancy\|issue slots\|executed ipc" \
        "$OUT/topn_ncu_details.csv" | head -20
    ;;
aligned)
    run_group select 200 4 tests/ops/test_select_kernel.py tests/ops/test_gluon_scores.py
    probe_run 300 topn_aligned --only topn_aligned --lengths 65536 8192
    ;;
table)
    prefill_table_and_tests
    ;;
recheck)
    probe_run 200 recheck --only scores_planes topn_aligned --lengths 8192
    timeout 100 python scripts/ncu_topn.py --length 8192 2>&1 | tail -2
    ;;
warps)
    probe_run 200 topn_warps --only topn --lengths 65536
    ;;
onewarp)
    run_group select 200 4 tests/ops/test_select_kernel.py tests/ops/test_gluon_scores.py
    probe_run 200 topn_onewarp --only topn_aligned --lengths 65536
    ;;
final)
    h200_prefill
    ;;
*)
    echo "usage: bash scripts/gpu_session75.sh planes|layers|topn_ncu|aligned|table|recheck|warps|onewarp|final" >&2
    exit 2
    ;;
esac
echo "elapsed $(( $(date +%s) - start )) s"
