#!/usr/bin/env bash
# The GPU calls of session 45 (H200). The decode step's score programs waited on L2 three times
# in a row (the compressed splits' partials, then the tile's masses or logits, then the tails of
# its first blocks or the token before each block, each load issued only once the one before had
# been used); with every load of the tile placed before the log-sum-exp they wait twice (SASS for
# sm_90a, the same instruction counts: 728 at batch 1, 1112 at batch 16).
#
#   bash scripts/gpu_session45.sh ab REV      # the decode kernels' GPU tests on this tree (report named
#                                             # after REV, as one tar), then decode steps of ab_base/src
#                                             # (git archive of the tree before) and of this one in turn,
#                                             # three times; scripts/gpu_decode_ab.py, each point checked
#                                             # against the float32 reference
#   bash scripts/gpu_session45.sh b1score     # batch 1 (8k, 64k): score programs of 8 warps over 32- or 64-block
#                                             # tiles, 16 warps over 128-block tiles (SASS: 496, 792 and 1040
#                                             # instructions against the default's 728 for 32 blocks in 4 warps;
#                                             # the selection programs' merge of 512, 256 or 128 candidates
#                                             # 1720, 1456 and 1272), then the batch-1 floor at 64k
#                                             # (gpu_decode_floor.py: the step's bytes and dependencies
#                                             # without the attention math), the H200's first
#   bash scripts/gpu_session45.sh b1pdl       # batch 1 (8k, 64k): programmatic dependent launch off, and off for
#                                             # one launch at a time (the floor above: a synthetic chain of three
#                                             # launches took 16.8 us without it, 19.1 with it)
#   bash scripts/gpu_session45.sh combine     # heads a combine program: 1 or 4 at batch 1 (default 2: its 36 slots
#                                             # pad to 64), 1, 2 or 8 at batch 16 (default 4: 12 slots pad to 16)
#   bash scripts/gpu_session45.sh heads REV   # the decode kernels' GPU tests on this tree (report named after REV,
#                                             # as one tar); decode steps of ab_base/src (the tree before: 4
#                                             # heads a combine program at batch 16-64) and of this one (8) in
#                                             # turn, twice, at batch 16, 32 and 64; the kernels' spans inside a
#                                             # replay at batch 1 and 16, 64k (gpu_decode_timeline.py)
#   bash scripts/gpu_session45.sh table       # the decode table at batch 1, 16, 32 and 64 and the decode
#                                             # points of the H200's pytest-benchmark baseline saved again
#   bash scripts/gpu_session45.sh split REV   # after the kernel modules were split (decode, selected, window):
#                                             # the GPU tests of every op's kernels, the layer, the captured
#                                             # decode step and the cache on this tree (report named after REV)
#   bash scripts/gpu_session45.sh module REV  # the GPU tests of the layer, its compiled forms and its
#                                             # captured decode step on this tree (report named after REV)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session45.sh ab REV | b1score | b1pdl | combine | heads REV | table | split REV | module REV}"
device_line
case "$step" in
ab)
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src (git archive of the tree before)" >&2; exit 2; }
    reported_tests 200 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py
    ab_rounds ab 3 100 base new
    ;;
b1score)
    variant_rounds variants_b1_score 1 65536 "8192 65536" 300 '{"score_warps": 8}' \
        '{"score_blocks": 64, "score_warps": 8}' '{"score_blocks": 128, "score_warps": 16}'
    timeout 170 python "$here/gpu_decode_floor.py" --context 65536 2>&1 | tee "$OUT/decode_floor_64k_h200.md" | tail -24
    ;;
b1pdl)
    variant_rounds variants_b1_pdl 1 65536 "8192 65536" 300 '{"pdl": false}' '{"pdl": [false, true, true]}' \
        '{"pdl": [true, false, true]}' '{"pdl": [true, true, false]}'
    ;;
combine)
    variant_rounds variants_b1_combine 1 65536 "8192 65536" 200 '{"combine_heads": 1}' '{"combine_heads": 4}'
    variant_rounds variants_b16_combine 16 8192 "8192 65536" 250 '{"combine_heads": 1}' '{"combine_heads": 2}' \
        '{"combine_heads": 8}'
    ;;
heads)
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src (git archive of the tree before)" >&2; exit 2; }
    reported_tests 200 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py
    AB_POINTS="16:8192 16:65536 32:65536 64:65536" ab_rounds heads_ab 2 100 base new
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 1 16 2>&1 \
        | tee "$OUT/decode_timeline_h200.md" | tail -12
    ;;
table)
    decode_table_and_baseline h200
    ;;
split)
    reported_tests 400 "${2:?the commit to name the report after}" tests/ops tests/test_module.py \
        tests/test_decode_graph.py tests/test_cache.py
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
