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
#   bash scripts/gpu_session45.sh table       # the decode table at batch 1, 16, 32 and 64 and the decode
#                                             # points of the H200's pytest-benchmark baseline saved again
#   bash scripts/gpu_session45.sh module REV  # the GPU tests of the layer, its compiled forms and its
#                                             # captured decode step on this tree (report named after REV)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session45.sh ab REV | table | module REV}"
device_line
case "$step" in
ab)
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src (git archive of the tree before)" >&2; exit 2; }
    reported_tests 200 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/ops/test_launch_options.py
    ab_rounds ab 3 100 base new
    ;;
table)
    decode_table_and_baseline h200
    ;;
module)
    reported_tests 420 "${2:?the commit to name the report after}" tests/test_module.py tests/test_compile.py \
        tests/test_decode_graph.py tests/test_cache.py
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
