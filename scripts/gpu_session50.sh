#!/usr/bin/env bash
# The GPU calls of session 50 (H200). Session 49's stamps (batch 16, 64k): every selection program
# waited for the whole score launch, whose last programs (on the SMs it crowds most) ended at
# 52.2 us, though most had ended by 47.7. Does waiting for one's own row-group's score tiles alone
# (row_handoff, nsa/ops/decode/handoff.py) start the selection programs' reads sooner?
#
# The hand-off was measured slower and not kept: the steps handoff, ab and fence ran on its three
# forms, commits 12416bb, 96d5f1f and c966cc8 (the last is docs/perf/attempts/decode_row_handoff.patch
# over da795ab).
#
#   bash scripts/gpu_session50.sh handoff REV  # the decode kernels' and launch options' GPU tests (report
#                                              # named after REV, as one tar); variant rounds against
#                                              # row_handoff off at batch 16, 1 and 32; stamps at batch 16,
#                                              # 64k, both ways
#   bash scripts/gpu_session50.sh ab REV       # (needs ab_base/src, git archive of da795ab) with the polls
#                                              # between the first and last load relaxed, and the hand-off
#                                              # on only once the batch fills the GPU: the same tests, then
#                                              # the two trees in turn, three times, at batch 1-64; stamps at
#                                              # batch 16, 64k
#   bash scripts/gpu_session50.sh fence REV    # (needs ab_base/src as above) the polls all relaxed, then one
#                                              # acquire fence: the same tests, then the two trees in turn,
#                                              # three times, at batch 16-64; stamps at batch 16, 64k and 32,
#                                              # 8k
#   bash scripts/gpu_session50.sh final REV    # (main, without the hand-off) the decode table at batch 1-64
#                                              # and the baseline's decode points; the decode GPU tests
#                                              # (kernels, launch options, layer, cache, captured step; report
#                                              # named after REV, as one tar); variant rounds of the batch-16
#                                              # launch's splits, combine heads and compressed stages at 64k
#   bash scripts/gpu_session50.sh warps        # two-warp score programs (at most 32 an SM by the block limit,
#                                              # fewer by registers) at batch 16 and 32, 64k, as a variant
#   bash scripts/gpu_session50.sh selection    # (one batch-64 check of da795ab had picked other blocks than
#                                              # the reference, 99.95 % equal) repeated draws at batch 64 and
#                                              # 32, 64k: every differing row checked as a valid top-n, and the
#                                              # swapped blocks' score gaps (gpu_decode_selection_check.py)
#   bash scripts/gpu_session50.sh b64 REV      # the real-size bf16 decode tests, a batch-64 case at 64k new
#                                              # among them (report named after REV, as one tar)
#   bash scripts/gpu_session50.sh sweep        # batch 16 at 64k: the window's token tile in the selected
#                                              # launch (32, 128), the compressed pass's tile (64, 2 stages), no L2
#                                              # eviction hints, as variants
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session50.sh handoff REV | ab REV | fence REV | final REV | warps | selection | b64 REV | sweep}"
device_line
case "$step" in
handoff)
    reported_tests 200 "${2:?handoff needs the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py
    off='{"row_handoff": false}'
    variant_rounds handoff_b16 16 65536 "8192 32768 65536" 150 "$off"
    variant_rounds handoff_b1 1 65536 "8192 65536" 100 "$off"
    variant_rounds handoff_b32 32 65536 "65536" 120 "$off"
    decode_stamps handoff 120 16 '{}' "$off"
    ;;
ab | fence)
    reported_tests 200 "${2:?$step needs the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py
    points="1:65536 16:8192 16:32768 16:65536 32:8192 32:65536 64:65536"
    [ "$step" = fence ] && points="16:8192 16:32768 16:65536 32:8192 32:65536 64:65536"
    AB_POINTS="$points" ab_rounds "handoff_$step" 3 150 base new
    decode_stamps "handoff_$step" 100 16 '{}'
    if [ "$step" = fence ]; then
        CONTEXT=8192 decode_stamps handoff_b32 100 32 '{}' '{"row_handoff": false}'
    fi
    ;;
final)
    decode_table_and_baseline h200
    reported_tests 300 "${2:?final needs the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py tests/test_module.py tests/test_cache.py tests/test_decode_graph.py
    variant_rounds tune_b16 16 65536 "65536" 200 '{"splits": [6, 1, 4]}' '{"splits": [6, 2, 8]}' \
        '{"combine_heads": 4}' '{"cmp_stages": 2}'
    ;;
warps)
    variant_rounds warps_b16 16 65536 "32768 65536" 150 '{"score_warps": 2}'
    variant_rounds warps_b32 32 65536 "65536" 120 '{"score_warps": 2}'
    ;;
selection)
    timeout 250 python scripts/gpu_decode_selection_check.py --batch 64 --draws 10 2>&1 \
        | tee "$OUT/decode_selection_b64_h200.md"
    timeout 150 python scripts/gpu_decode_selection_check.py --batch 32 --draws 10 2>&1 \
        | tee "$OUT/decode_selection_b32_h200.md"
    ;;
b64)
    reported_tests 300 "${2:?b64 needs the commit to name the report after}" tests/ops/test_decode_kernel.py -k real_size
    ;;
sweep)
    variant_rounds sweep_b16 16 65536 "65536" 250 '{"win_tile": 32}' '{"win_tile": 128}' '{"cmp_tile": 64, "cmp_stages": 2}' \
        '{"l2_hints": false}'
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
