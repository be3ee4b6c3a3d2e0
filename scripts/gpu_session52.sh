#!/usr/bin/env bash
# The GPU calls of session 52 (H200). Session 51's stamps (batch 16, 64k): the compressed pass's
# 384 programs, each the same share of one row-group's tokens, end 33.1 / 40.6 / 45.5 us (min /
# median / max), and the pass ends with the slowest (other splits, rows and SMs each replay); its
# split of 128 tiles into 6 leaves the last split 18 tiles against 22. A pool of each row-group's
# last tiles, claimed a few at a time by whichever of its splits asks first (decode_fwd's cmp_pool:
# tiles a split leaves to the pool; pool_claim: tiles a claim; cmp_maxnreg: the kernel's register
# cap, since the pool's loop takes the kernel from 128 registers to 163), as variants:
#
#   bash scripts/gpu_session52.sh pool   # (ran at 9da97a1) variant rounds at batch 16 (32k, 64k; each
#                                        # variant checked against the float32 reference at 64k) and 32
#                                        # (64k), stamps at batch 16, 64k
#
# Every pool was slower (a claim is a tile or two, each an atomic and an unpipelined copy):
# dropped, docs/perf/attempts/decode_cmp_pool.patch. Next, the combine's wait: each program of the
# selected launch counts itself in its row-group's counter once its partial is stored, and each
# combine program merges once its row-groups are counted in full, waiting for the whole launch
# only after its output is stored (decode_fwd's combine_handoff):
#
#   bash scripts/gpu_session52.sh handoff # (ran at 1c1a449) variant rounds at batch 16 (8k, 32k, 64k), 32
#                                         # and 1 (64k, 8k); stamps at batch 16, 64k and batch 1, 64k
#
# Slower everywhere (a poll sees the count up to an L2 round trip late): dropped,
# docs/perf/attempts/decode_combine_handoff.patch. Next, no code change: the window back in launch
# 1 at batch 16 and 32 (session 5 measured it slower on the H100, before PDL and the one-wave
# passes), so that its 17 MB move during the compressed pass rather than beside the selected
# blocks, and the selected launch holds the selection programs alone:
#
#   bash scripts/gpu_session52.sh window1 # (ran at 1c1a449, the hand-off off) variant rounds at batch 16
#                                         # (8k, 32k, 64k) and 32 (64k)
#
# Slower at every point (batch 16 at 8k by 1.3-1.5 us with (4, 2, 4), 2-11 us elsewhere). Then, on
# main (the kernels of da795ab):
#
#   bash scripts/gpu_session52.sh table   # (ran at abc9a3e and 759336a) the decode table at batch 1-64 (nsa-bench,
#                                         # graph replay, dense in the same run)
#
# Then no score launch at all: each compressed split, its partial stored, counts itself in its
# row-group's arrival count, waits for the row-group's other splits and scores the row's tiles
# i_s, i_s + S_CMP, ... itself (decode_fwd's score_in_cmp); the selection programs then wait for
# launch 1. The 2048 score programs no longer crowd the SMs the compressed launch leaves first:
#
#   bash scripts/gpu_session52.sh scorecmp # (ran at 31eb0a8) variant rounds at batch 16 (8k, 32k, 64k),
#                                          # 32 and 64 (64k); stamps at batch 16, 64k
#
# Correct, and slower everywhere: a split scores its tiles one after another, 9.5 us (median) for
# its 5-6 at batch 16, 64k, where the score launch's 32 programs a row-group take them at once. Two
# tiles a step (144 registers; 4 take 219, past 3 programs an SM):
#
#   bash scripts/gpu_session52.sh scorecmp2 # (ran at fa9ec0b) variant rounds at batch 16 (64k), the
#                                           # default tiles a step and two; stamps at batch 16, 64k
#
# Two tiles a step: 76.4-76.6 us against 72.4-73.0 (the default there took 8 tiles a step: 255
# registers and spills, two programs an SM, 96 us). Dropped: docs/perf/attempts/decode_score_in_cmp.patch.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session52.sh pool | handoff | window1 | table | scorecmp | scorecmp2}"
device_line

p2='{"cmp_pool": 2}'
p4='{"cmp_pool": 4}'
p8='{"cmp_pool": 8}'
p4c2='{"cmp_pool": 4, "pool_claim": 2}'
p4r='{"cmp_pool": 4, "cmp_maxnreg": 128}'
case "$step" in
pool)
    variant_rounds pool_b16 16 65536 "32768 65536" 240 "$p2" "$p4" "$p8" "$p4c2" "$p4r"
    variant_rounds pool_b32 32 65536 "65536" 100 "$p4" "$p4r"
    decode_stamps pool 120 16 '{}' "$p4" "$p4r"
    ;;
handoff)
    hand='{"combine_handoff": true}'
    variant_rounds handoff_b16 16 65536 "8192 32768 65536" 200 "$hand"
    variant_rounds handoff_b32 32 65536 "65536" 90 "$hand"
    variant_rounds handoff_b1 1 65536 "8192 65536" 90 "$hand"
    decode_stamps handoff 120 "16 1" '{}' "$hand"
    ;;
window1)
    variant_rounds window1_b16 16 65536 "8192 32768 65536" 200 '{"window_in_selected": false, "splits": [5, 1, 4]}' \
        '{"window_in_selected": false, "splits": [4, 2, 4]}'
    variant_rounds window1_b32 32 65536 "65536" 100 '{"window_in_selected": false, "splits": [2, 1, 8]}'
    ;;
table)
    decode_table h200
    ;;
scorecmp)
    in_cmp='{"score_in_cmp": true}'
    variant_rounds scorecmp_b16 16 65536 "8192 32768 65536" 200 "$in_cmp"
    variant_rounds scorecmp_b32 32 65536 "65536" 90 "$in_cmp"
    variant_rounds scorecmp_b64 64 65536 "65536" 100 "$in_cmp"
    decode_stamps scorecmp 100 16 '{}' "$in_cmp"
    ;;
scorecmp2)
    two='{"score_in_cmp": true, "score_cmp_tiles": 2}'
    variant_rounds scorecmp2_b16 16 65536 "65536" 120 '{"score_in_cmp": true}' "$two"
    decode_stamps scorecmp2 90 16 "$two"
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
