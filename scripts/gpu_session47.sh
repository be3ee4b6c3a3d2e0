#!/usr/bin/env bash
# The GPU calls of session 47 (H200). The combine launch of a decode step merged every branch's
# partials through one tile as wide as the widest branch; on next/combine-branches (rebased onto
# main as the commit measured) it merges each branch alone, in tiles of that branch's own width, and
# requests every branch read after its wait before it merges any (SASS at batch 1: 904 instructions
# against 1696).
#
#   bash scripts/gpu_session47.sh branches REV  # the decode kernels' GPU tests (report named after REV,
#                                               # as one tar), decode steps of ab_base/src (git archive
#                                               # of main's src) and of this tree in turn, three times;
#                                               # the kernels' spans inside a replay at batch 1 and 16, 64k
#   bash scripts/gpu_session47.sh probe         # probe kernels over the batch-16 compressed pass's bytes
#                                               # (gpu_cmp_stream_probe.py: copies alone, dots, softmax,
#                                               # block masses) beside the library's kernels, 64k
#   bash scripts/gpu_session47.sh topn REV      # (needs docs/perf/attempts/decode_topn_in_score.patch, dropped)
#                                               # the last score program of each (row, KV group) merges the
#                                               # candidates once (topn_in_score, the default once the batch
#                                               # fills the GPU): the decode kernels' GPU tests (report named
#                                               # after REV, as one tar), decode steps of ab_base/src and of
#                                               # this tree in turn, three times; batch 1 with it on; the
#                                               # kernels' spans inside a replay at batch 16, 64k
#   bash scripts/gpu_session47.sh b1            # batch 1 at 32k and 64k: more compressed or window splits (their
#                                               # partials are now merged before the combine's wait, beside the
#                                               # selection programs) and 1 or 4 heads a combine program
#   bash scripts/gpu_session47.sh b1short       # batch 1 at 8k, 16k and 32k: 16 compressed splits, 8 window
#                                               # splits, both (the default takes 8 and 4 up to 32k)
#   bash scripts/gpu_session47.sh splits REV    # after the batch-1 split rule: the decode kernels' GPU tests
#                                               # (report named after REV, as one tar), decode steps of
#                                               # ab_base/src and of this tree in turn at batch 1, 8k-64k,
#                                               # three times, then the table (as `table`)
#   bash scripts/gpu_session47.sh table         # the decode table at batch 1, 16, 32 and 64 and the decode
#                                               # points of the H200's pytest-benchmark baseline saved again
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session47.sh branches REV | probe | topn REV | b1 | b1short | splits REV | table}"
device_line
case "$step" in
branches)
    AB_POINTS="1:8192 1:65536 16:8192 16:65536 32:65536" decode_ab branches_ab "${2:-}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py || exit 2
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 1 16 --replays 9 2>&1 \
        | tee "$OUT/decode_timeline_branches_h200.md" | tail -12
    ;;
topn)
    AB_POINTS="1:8192 1:65536 16:8192 16:65536 32:65536" decode_ab topn_ab "${2:-}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py || exit 2
    variant_rounds topn_b1 1 65536 "8192 65536" 150 '{"topn_in_score": true}'
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 16 --replays 9 2>&1 \
        | tee "$OUT/decode_timeline_topn_h200.md" | tail -6
    ;;
b1)
    variant_rounds b1_splits 1 65536 "32768 65536" 300 '{"splits": [32, 4, 1]}' '{"splits": [24, 4, 1]}' \
        '{"splits": [32, 8, 1]}' '{"splits": [16, 8, 1]}' '{"combine_heads": 4}' '{"combine_heads": 1}'
    ;;
b1short)
    variant_rounds b1_short 1 32768 "8192 16384 32768" 300 '{"splits": [16, 4, 1]}' '{"splits": [8, 8, 1]}' \
        '{"splits": [16, 8, 1]}'
    ;;
probe)
    timeout 300 python scripts/gpu_cmp_stream_probe.py 2>&1 | tee "$OUT/cmp_stream_probe_h200.md" | tail -40
    ;;
splits)
    AB_POINTS="1:8192 1:16384 1:32768 1:65536" decode_ab splits_ab "${2:-}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py || exit 2
    decode_table_and_baseline h200
    ;;
table)
    decode_table_and_baseline h200
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
