#!/usr/bin/env bash
# The GPU calls of session 44 (H200). Two cuts to the decode step's selection chain, in the
# instructions of the score and selection programs (both issue about one instruction in ten
# cycles a warp at batch 16, session 43): the selection programs merge the score tiles' sorted
# candidate runs instead of a bitonic top-k over all of them (the batch-1 program 2272 -> 1720
# SASS instructions, batch 16 3472 -> 2952), and the score programs take the GPU's fast log2
# for each head's log-sum-exp (the one-warp program 1216 -> 1112).
#
#   bash scripts/gpu_session44.sh ab REV      # the decode GPU tests on this tree (report named after REV,
#                                             # as one tar), then decode steps of three trees in turn, twice:
#                                             # ab_base/src (old: before both), ab_sorted/src (sorted runs
#                                             # alone) and this one (new); scripts/gpu_decode_ab.py, each
#                                             # point checked against the float32 reference
#   bash scripts/gpu_session44.sh table       # the decode table at batch 1, 16, 32 and 64 (nsa-bench, graph
#                                             # replay), the decode points of the H200's pytest-benchmark
#                                             # baseline saved again, then score tiles of 64 blocks at batch 16
#                                             # against the default (gpu_decode.py variants, twice)
#   bash scripts/gpu_session44.sh b1          # batch 1 (8k, 64k), 0.7 us short of 2.5x at 64k after the two cuts:
#                                             # score tiles of 64 and 128 blocks (256 and 128 candidates, one and
#                                             # two levels less to merge), 2 selected blocks a program, selected
#                                             # blocks through descriptors; against the default, twice
#   bash scripts/gpu_session44.sh b1warps     # batch 1: 2-warp score programs, 8- or 2-warp selection programs
#   bash scripts/gpu_session44.sh b1tiles     # batch 1: the compressed pass in 128-token tiles (2 a split instead of 4
#                                             # of 64: half the serial round trips), 4 or 8 warps, 1 or 2 stages (3
#                                             # stages of such tiles ask 260 KiB of shared memory)
#   bash scripts/gpu_session44.sh b16tiles    # batch 16 and 32: score tiles of 16 blocks (every block a candidate:
#                                             # twice the programs at half the work, one merge level more)
#   bash scripts/gpu_session44.sh parts       # batch 16 at 64k as 2 parts of 8 rows on streams (session 43's
#                                             # gpu_decode_chains.py), each part with the launches of a batch that
#                                             # fills the GPU (8 rows fall just short: session 43's parts took the
#                                             # batch-1 launches), with and without PDL (early programs hold slots)
#   bash scripts/gpu_session44.sh cmp         # batch 16 (8k, 64k): the compressed pass (39 of the step's 78 us at
#                                             # 64k, 134 MB at about 3.4 TB/s) in one- and two-warp programs, 3 an
#                                             # SM in 3 stages, and one-warp ones in 2 stages, 6 or 4 an SM (no
#                                             # barriers in a one-warp tile step); against the default, twice
#   bash scripts/gpu_session44.sh noflush     # the decode table (batch 1, 16, 32) without the L2 flush, its inputs
#                                             # rotated over sets past twice the L2: no dirty lines of a zeroing
#                                             # flush written back during the step (the issue's "dense about 41 us")
#   bash scripts/gpu_session44.sh tests REV   # the decode kernels' GPU tests on this tree (report named after REV,
#                                             # as one tar): the session's last call, after its new CPU test
#   bash scripts/gpu_session44.sh module REV  # the GPU tests of the layer, its compiled forms and its captured
#                                             # decode step on this tree (report named after REV, as one tar)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session44.sh ab REV | table | b1 | b1warps | b1tiles | b16tiles | parts | cmp | noflush | module REV | tests REV}"
device_line
case "$step" in
ab)
    for side in base sorted; do
        [ -d "ab_$side/src/nsa" ] || { echo "no ab_$side/src (git archive of that tree)" >&2; exit 2; }
    done
    reported_tests 200 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py tests/test_decode_graph.py tests/test_cache.py \
        tests/ops/test_launch_options.py
    ab_rounds ab 2 100 base sorted new
    ;;
table)
    decode_table_and_baseline h200
    variant_rounds variants_b16 16 8192 "8192 65536" 150 '{"score_blocks": 64}'
    ;;
b1)
    variant_rounds variants_b1 1 65536 "8192 65536" 300 '{"score_blocks": 64}' '{"score_blocks": 128}' \
        '{"splits": [16, 4, 2]}' '{"sel_desc": true}'
    ;;
b1warps)
    variant_rounds variants_b1_warps 1 65536 "8192 65536" 300 '{"score_warps": 2}' \
        '{"num_warps": 8, "cmp_warps": 4}' '{"num_warps": 2, "cmp_warps": 4}'
    ;;
b1tiles)
    variant_rounds variants_b1_tiles 1 65536 "8192 65536" 300 '{"cmp_tile": 128, "cmp_warps": 8, "cmp_stages": 1}' \
        '{"cmp_tile": 128, "cmp_warps": 8, "cmp_stages": 2}' '{"cmp_tile": 128, "cmp_stages": 1}'
    ;;
b16tiles)
    variant_rounds variants_b16_tiles 16 65536 "8192 65536" 200 '{"score_blocks": 16}'
    variant_rounds variants_b32_tiles 32 65536 "65536" 200 '{"score_blocks": 16}'
    ;;
parts)
    fill='"cmp_desc": true, "score_mass": true, "window_in_selected": true, "sel_desc": true, "cmp_stages": 3'
    for launch in "{$fill, \"splits\": [12, 2, 4]}" "{$fill, \"splits\": [12, 2, 4], \"pdl\": false}"; do
        timeout 150 python "$here/gpu_decode_chains.py" --contexts 65536 --batches 16 --chains 2 --launch "$launch" \
            2>&1 | tee -a "$OUT/decode_parts_h200.md" | grep -v "^$"
        echo "== parts: rc $? after $(( $(date +%s) - start )) s"
    done
    ;;
cmp)
    # 3 stages take 68 KiB of shared memory at any warp count (3 programs an SM, as the default's 6
    # splits), 2 stages 36 KiB (6 an SM: 12 splits, or 8)
    variant_rounds variants_cmp_b16 16 65536 "8192 65536" 300 '{"cmp_warps": 1}' '{"cmp_warps": 2}' \
        '{"cmp_warps": 1, "splits": [12, 2, 4], "cmp_stages": 2}' '{"cmp_warps": 1, "splits": [8, 2, 4], "cmp_stages": 2}'
    ;;
noflush)
    timeout 200 python -m nsa.bench decode --profile h200 --batch 1,16,32 --graph --budget 4 --no-flush \
        --baseline none --csv "$OUT/decode_noflush_h200.csv" 2>&1 | tail -18
    echo "== table without the flush: rc $? after $(( $(date +%s) - start )) s"
    ;;
tests)
    reported_tests 200 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py
    ;;
module)
    layer_gpu_tests "${2:?the commit to name the report after}"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
