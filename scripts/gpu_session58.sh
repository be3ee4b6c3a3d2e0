#!/usr/bin/env bash
# The GPU calls of session 58 (H200). A decode step's batch-16 compressed pass (launch 1) reads the
# compressed keys and values, 134 MB at 64k, in one wave at about 3.5 TB/s, and the score launch
# after it moves few bytes for its 8 us. Scoring needs only the keys. With values_apart (new, off)
# launch 1 reads the keys alone and leaves each tile's softmax weights (8.4 MB in bf16), and a values
# launch on a stream of its own, forked after launch 1 and joined before the combine, builds the
# compressed splits' accumulators from them and the values while the score and selected launches run
# (bitwise launch 1's own):
#
#   bash scripts/gpu_session58.sh apart REV   # the values_apart GPU tests (eager and graph, bitwise);
#                                             # the step both ways, ABBA twice, at batch 16-64, 64k,
#                                             # and batch 16 at 8k, 32k, batch 1 at 64k, with dense;
#                                             # each kernel's time; the timeline of a batch-16 replay
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session58.sh apart REV}"
device_line

case "$step" in
apart)
    rev="${2:?the apart step needs the commit to name the test report after}"
    timeout 240 python -m pytest -q -x tests/ops/test_decode_kernel.py -k "values_apart" --gpu-profile auto \
        -p no:cacheprovider 2>&1 | tail -4
    echo "== tests after $(( $(date +%s) - start )) s ($rev)"
    timeout 300 python scripts/gpu_values_apart.py --dense 2>&1 | tee "$OUT/decode_values_apart_h200.md"
    echo "== A/B after $(( $(date +%s) - start )) s"
    timeout 90 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 16 --replays 5 \
        --variants '{"values_apart": false}' '{"values_apart": true}' 2>&1 | tee "$OUT/decode_values_apart_timeline_h200.md" | tail -40
    ;;
*)
    echo "unknown step $step"
    exit 2
    ;;
esac
