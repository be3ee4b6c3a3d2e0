#!/usr/bin/env bash
# The GPU calls of session 48 (H200). Once the batch fills the GPU, the score launch ranks tiles of
# 32 selection blocks in one-warp programs (2048 of them at batch 16, 64k) and each selection
# program merges their 512 candidates; the link from the compressed pass's end to the score
# launch's end is 11 us there, the selection's 14. Wider score tiles leave fewer candidates (256
# at 64 blocks a tile, 128 at 128) in fewer, longer programs.
#
#   bash scripts/gpu_session48.sh scoretiles    # batch 16 (8k, 64k) and 32 (64k): score tiles of 64 and
#                                               # 128 blocks in 1, 2 or 4 warps against the default, in
#                                               # two rounds; the kernels' spans inside a replay at
#                                               # batch 16, 64k, for each
#   bash scripts/gpu_session48.sh handin REV    # (needs docs/perf/attempts/decode_mass_handin.patch, dropped)
#                                               # the compressed pass's block sums without the exchange between
#                                               # blocks (each block's own sum, and what it hands on stored at
#                                               # the next block's index; the score launch adds the two): the
#                                               # decode kernels' GPU tests (report named after REV, as one tar),
#                                               # decode steps of ab_base/src and of this tree in turn, three
#                                               # times; the kernels' spans inside a replay at batch 16, 64k
#   bash scripts/gpu_session48.sh transposed REV  # the score launch's block masses as [blocks, heads] tiles (936
#                                               # SASS instructions a one-warp program against 1112): the decode
#                                               # kernels' GPU tests (report named after REV, as one tar), decode
#                                               # steps of ab_base/src and of this tree in turn, three times, at
#                                               # batch 16-64; the kernels' spans inside a replay at batch 16, 64k
#   bash scripts/gpu_session48.sh transposed1 REV  # the same for the score launch's logits at batch 1 (592
#                                               # instructions a 4-warp program against 728): the decode kernels'
#                                               # GPU tests, decode steps of ab_base/src and of this tree in turn,
#                                               # three times, at batch 1
#   bash scripts/gpu_session48.sh vecload REV   # the score launch's block masses in 128-bit loads (visibility
#                                               # applied after the loads; 872 instructions against 936): the
#                                               # decode kernels' GPU tests, decode steps of ab_base/src and of
#                                               # this tree in turn, three times, at batch 16-64; then the decode
#                                               # table and the baseline's decode points (as `table` did)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session48.sh scoretiles | handin REV | transposed REV | transposed1 REV | vecload REV}"
device_line
case "$step" in
scoretiles)
    tiles=('{"score_blocks": 64}' '{"score_blocks": 64, "score_warps": 2}' '{"score_blocks": 128, "score_warps": 4}'
           '{"score_blocks": 128, "score_warps": 2}')
    for round in 1 2; do
        variant_rounds "score_tiles_b16_$round" 16 65536 "8192 65536" 150 "${tiles[@]}"
        variant_rounds "score_tiles_b32_$round" 32 65536 "65536" 120 "${tiles[@]}"
    done
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 16 --replays 9 \
        --variants '{}' "${tiles[@]}" 2>&1 | tee "$OUT/decode_timeline_score_tiles_h200.md" | tail -30
    ;;
handin)
    AB_POINTS="1:65536 16:8192 16:65536 32:65536 64:65536" decode_ab handin_ab "${2:-}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py || exit 2
    timeout 60 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 16 --replays 9 2>&1 \
        | tee "$OUT/decode_timeline_handin_h200.md" | tail -6
    ;;
transposed)
    AB_POINTS="16:8192 16:32768 16:65536 32:65536 64:65536" decode_ab transposed_ab "${2:-}" \
        tests/ops/test_decode_kernel.py tests/test_decode_graph.py || exit 2
    timeout 60 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 16 --replays 9 2>&1 \
        | tee "$OUT/decode_timeline_transposed_h200.md" | tail -6
    ;;
transposed1)
    AB_POINTS="1:8192 1:16384 1:32768 1:65536" decode_ab transposed1_ab "${2:-}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py
    ;;
vecload)
    AB_POINTS="16:8192 16:65536 32:65536 64:65536" decode_ab vecload_ab "${2:-}" tests/ops/test_decode_kernel.py
    decode_table_and_baseline h200
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
