#!/usr/bin/env bash
# The GPU calls of session 46 (H200). The selection launch of a batch-1 step had every program find
# the whole top-n (a bitonic merge of the score tiles' sorted runs, some 25 dependent exchange
# stages) before reading its one block. With `tile_owned` there is one selection program per score
# tile instead: it ranks its own candidates against all of them (how many keys are larger, one
# [16, 512] comparison and a sum) and attends over those of rank below n, one partial per block in
# the slot of its rank; the combine launch sorts block_idx. It was slower and is not in the tree:
# the steps `owned` and `owned2` need docs/perf/attempts/decode_tile_owned_selection.patch applied.
#
#   bash scripts/gpu_session46.sh owned       # the decode kernel tests with "tile" in their name on the
#                                             # GPU; batch 1 at 8k-64k and batch 16 at 8k and 64k with
#                                             # tile_owned on (and at batch 1 with 64-block score tiles),
#                                             # the default in turn, each variant checked against the
#                                             # float32 reference; the kernels' spans inside a replay at
#                                             # batch 1, 64k, both ways (gpu_decode_timeline.py)
#   bash scripts/gpu_session46.sh owned2      # after `owned` (a tile's blocks one after the other in one program:
#                                             # slower): the same tests, then batch 1 at 16k-64k with 2, 4 and 8
#                                             # selection programs a score tile (`owned_programs`), each taking
#                                             # every 2nd, 4th or 8th of the tile's selected blocks
#   bash scripts/gpu_session46.sh layout      # the caches stored head-major (each KV head's tokens contiguous,
#                                             # the same [B, T, H, D] view; `head_major` in gpu_decode.py) against
#                                             # the token-major default: batch 16 at 8k and 64k, batch 32 and 1 at
#                                             # 64k (session 4 measured it on an H100 only, before the bulk copies)
#   bash scripts/gpu_session46.sh early REV   # the combine merges the compressed launch's partials before its wait
#                                             # (`combine_early`; the selection programs let it start only after
#                                             # their own wait): the decode kernels' GPU tests on this tree (report
#                                             # named after REV, as one tar), then decode steps of ab_base/src (git
#                                             # archive of the tree before) and of this one in turn, three times;
#                                             # the kernels' spans inside a replay at batch 1 and 16, 64k
#   bash scripts/gpu_session46.sh narrow REV  # the combine's two parts each in a tile of its own width (at batch 1,
#                                             # 64k: 16 slots after the wait in a tile of 16, not 64): the decode
#                                             # kernels' GPU tests (report named after REV, as one tar), decode steps
#                                             # of ab_base/src (the tree before) and of this one in turn, three times;
#                                             # then 4 and 8 heads a combine program at batch 1 on this tree
#   bash scripts/gpu_session46.sh timeline    # the kernels' spans inside a replay at batch 1 and 16, 64k
#   bash scripts/gpu_session46.sh table       # the decode table at batch 1, 16, 32 and 64 and the decode
#                                             # points of the H200's pytest-benchmark baseline saved again
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

# The decode kernel tests with "tile" in their name, in one process on the GPU: tile_tests NAME
# writes $OUT/tests_NAME.txt.
tile_tests() {
    timeout 200 python -m pytest -q -p no:cacheprovider -m "not benchmark" --gpu-profile auto -rfEs --tb=short \
        tests/ops/test_decode_kernel.py -k "tile" > "$OUT/tests_$1.txt" 2>&1
    echo "== tests: rc $? after $(( $(date +%s) - start )) s"
    tail -3 "$OUT/tests_$1.txt"
}

step="${1:?usage: scripts/gpu_session46.sh owned | owned2 | layout | early REV | narrow REV | timeline | table}"
device_line
case "$step" in
owned)
    tile_tests owned
    variant_rounds owned_b1 1 65536 "8192 16384 32768 65536" 400 '{"tile_owned": true}' \
        '{"tile_owned": true, "score_blocks": 64}'
    variant_rounds owned_b16 16 65536 "8192 65536" 300 '{"tile_owned": true}'
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 1 --variants '{}' '{"tile_owned": true}' \
        2>&1 | tee "$OUT/decode_timeline_owned_h200.md" | tail -12
    ;;
owned2)
    tile_tests owned2
    variant_rounds owned2_b1 1 65536 "16384 32768 65536" 400 '{"tile_owned": true, "owned_programs": 2}' \
        '{"tile_owned": true, "owned_programs": 4}' '{"tile_owned": true, "owned_programs": 8}'
    ;;
layout)
    variant_rounds layout_b16 16 65536 "8192 65536" 300 '{"head_major": true}'
    variant_rounds layout_b32 32 65536 "65536" 200 '{"head_major": true}'
    variant_rounds layout_b1 1 65536 "65536" 150 '{"head_major": true}'
    ;;
early)
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src (git archive of the tree before)" >&2; exit 2; }
    reported_tests 200 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py tests/test_decode_graph.py
    AB_POINTS="1:8192 1:65536 16:8192 16:65536 32:65536" ab_rounds early_ab 3 120 base new
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 1 16 2>&1 \
        | tee "$OUT/decode_timeline_early_h200.md" | tail -12
    ;;
narrow)
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src (git archive of the tree before)" >&2; exit 2; }
    reported_tests 150 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py
    AB_POINTS="1:8192 1:65536 16:8192 16:65536 32:65536" ab_rounds narrow_ab 3 120 base new
    variant_rounds narrow_b1_heads 1 65536 "8192 65536" 200 '{"combine_heads": 4}' '{"combine_heads": 8}'
    ;;
timeline)
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 1 16 --replays 9 2>&1 \
        | tee "$OUT/decode_timeline_h200.md" | tail -12
    ;;
table)
    decode_table_and_baseline h200
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
