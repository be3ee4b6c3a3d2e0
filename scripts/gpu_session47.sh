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
#   bash scripts/gpu_session47.sh table         # the decode table at batch 1, 16, 32 and 64 and the decode
#                                               # points of the H200's pytest-benchmark baseline saved again
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session47.sh branches REV | table}"
device_line
case "$step" in
branches)
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src (git archive of the tree before)" >&2; exit 2; }
    reported_tests 150 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py
    AB_POINTS="1:8192 1:65536 16:8192 16:65536 32:65536" ab_rounds branches_ab 3 120 base new
    timeout 120 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 1 16 --replays 9 2>&1 \
        | tee "$OUT/decode_timeline_branches_h200.md" | tail -12
    ;;
table)
    decode_table_and_baseline h200
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
