#!/usr/bin/env bash
# The GPU calls of session 51 (H200). Session 50's stamps (batch 16, 64k): the score launch's 2048
# one-warp programs pile up to 32 an SM on the SMs the compressed launch leaves first (its CTA
# limit), and the selected launch's programs, placed after them, find room late: the window's
# programs started at 41-55 us (median 46) and read beside the selection programs' blocks, some
# selection programs only reached their wait at 59 us. Two launch options of decode_fwd, alone and
# together, as variants:
#   window_first: the selected launch's grid transposed, its window programs first in launch order
#                 (the GPU places a launch's programs in that order);
#   score_late:   the compressed programs let the score launch start only once their split is
#                 attended (session 49's docs/perf/attempts/decode_score_late.patch): its programs
#                 then spread evenly over the SMs.
#
# Both were measured no faster and dropped; the step ran on commit 128bfac, where they exist. The
# next, selection_first (the selected launch's grid transposed, its selection programs first), ran
# on bd97783 and was dropped too (all three: docs/perf/attempts/decode_window_first.patch).
#
#   bash scripts/gpu_session51.sh variants   # variant rounds at batch 16 (8k, 32k, 64k; each variant
#                                            # checked against the float32 reference at 64k), stamps at
#                                            # batch 16, 64k, for each
#   bash scripts/gpu_session51.sh selfirst   # the selection programs first in the selected launch instead
#                                            # (selection_first): variant rounds at batch 16 (8k, 32k, 64k)
#                                            # and 32 (64k), stamps at batch 16, 64k
#
# Then: no score launch at all once the batch fills the GPU (score_in_selected): each selection
# program waits for the compressed launch and scores its row from the block masses itself, in
# chunks of score_chunk blocks, keeping the running n best (a top-k of each chunk, one bitonic merge).
#
#   bash scripts/gpu_session51.sh inselected # (ran at 7def5ef) variant rounds at batch 16 (8k, 32k, 64k),
#                                            # 32 (64k) and 1 (64k, block masses forced), chunks of 64, 128
#                                            # and 256 blocks; stamps at batch 16, 64k
#
# The first form read each chunk's masses one head's float at a time and took 37 us a program at
# batch 16, 64k. The second reads them as [heads, blocks] tiles along the blocks (128-bit loads, the
# head sum inside each thread), chunks of 256 blocks (8032 SASS instructions against 9392 in chunks of
# 128, 16232 now; 3400 with the score launch):
#
#   bash scripts/gpu_session51.sh inselected2 # (ran at 223fe31) variant rounds at batch 16 (32k, 64k),
#                                             # chunks of 256 and 512 blocks; stamps at batch 16, 64k
#
# Neither form was kept (docs/perf/attempts/decode_score_in_selected_chunks.patch). Last, on main:
#
#   bash scripts/gpu_session51.sh table       # the decode table at batch 1-64 (nsa-bench, graph replay,
#                                             # dense in the same run); ran twice, at 170b277 and f35f0ab
#                                             # (the same kernels)
#
# The selection programs that reach their wait last are those the score launch's programs keep off
# the SMs it crowds: 32 one-warp programs of 64 registers fill an SM's 64K. Compiled for at most 40
# registers (the same 880 SASS instructions, no spills) 32 of them take 40K, and for 32 (64 bytes
# spilled) 32K, leaving room for one or two selected programs. Ran on 49a6f2c (score_maxnreg, not
# kept: docs/perf/attempts/decode_score_maxnreg.patch):
#
#   bash scripts/gpu_session51.sh maxnreg     # score_maxnreg 40 and 32 as variants at batch 16 (8k, 32k,
#                                             # 64k) and 32 (64k); stamps at batch 16, 64k
#
# With 40 registers the selection programs reached their wait sooner but still waited for the whole
# score launch. Session 50's row hand-off (docs/perf/attempts/decode_row_handoff.patch: each
# selection program waits for its own row-group's score tiles) had found them placed too late to
# gain; the two together, on da795ab's kernels (the hand-off on by default there). Ran on 5253f58,
# the hand-off patch and score_maxnreg over main; no faster:
#
#   bash scripts/gpu_session51.sh handoff40   # variant rounds at batch 16 (32k, 64k) and 32 (64k): the
#                                             # hand-off off, 40 registers, both; stamps at batch 16, 64k
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session51.sh variants | selfirst | inselected | inselected2 | table | maxnreg | handoff40}"
device_line
first='{"window_first": true}'
late='{"score_late": true}'
both='{"window_first": true, "score_late": true}'
case "$step" in
variants)
    variant_rounds place_b16 16 65536 "8192 32768 65536" 260 "$first" "$late" "$both"
    decode_stamps place 150 16 '{}' "$first" "$late" "$both"
    ;;
selfirst)
    sel='{"selection_first": true}'
    variant_rounds selfirst_b16 16 65536 "8192 32768 65536" 200 "$sel"
    variant_rounds selfirst_b32 32 65536 "65536" 120 "$sel"
    decode_stamps selfirst 100 16 '{}' "$sel"
    ;;
inselected)
    fold='{"score_in_selected": true}'
    variant_rounds fold_b16 16 65536 "8192 32768 65536" 200 "$fold" '{"score_in_selected": true, "score_chunk": 64}' \
        '{"score_in_selected": true, "score_chunk": 256}'
    variant_rounds fold_b32 32 65536 "65536" 120 "$fold"
    variant_rounds fold_b1 1 65536 "65536" 100 '{"score_in_selected": true, "score_mass": true}' '{"score_mass": true}'
    decode_stamps fold 100 16 '{}' "$fold"
    ;;
inselected2)
    fold='{"score_in_selected": true, "score_chunk": 256}'
    variant_rounds fold2_b16 16 65536 "32768 65536" 200 "$fold" '{"score_in_selected": true, "score_chunk": 512}'
    decode_stamps fold2 100 16 '{}' "$fold"
    ;;
table)
    decode_table h200
    ;;
maxnreg)
    r40='{"score_maxnreg": 40}'
    r32='{"score_maxnreg": 32}'
    variant_rounds maxnreg_b16 16 65536 "8192 32768 65536" 200 "$r40" "$r32"
    variant_rounds maxnreg_b32 32 65536 "65536" 120 "$r40" "$r32"
    decode_stamps maxnreg 100 16 '{}' "$r40" "$r32"
    ;;
handoff40)
    off='{"row_handoff": false}'
    r40='{"score_maxnreg": 40}'
    off40='{"row_handoff": false, "score_maxnreg": 40}'
    variant_rounds handoff40_b16 16 65536 "32768 65536" 200 "$off" "$r40" "$off40"
    variant_rounds handoff40_b32 32 65536 "65536" 120 "$off" "$r40"
    decode_stamps handoff40 100 16 "$off" '{}' "$r40"
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
