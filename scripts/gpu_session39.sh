#!/usr/bin/env bash
# The GPU calls of session 39 (session 38's first call, `gpu_session38.sh pending`, validated and
# timed its one rotation a step).
#
#   bash scripts/gpu_session39.sh emission REV OLD_SRC  # a decode step's learnable compression in two
#                                             # launches (nsa.ops.decode.mlp_emission): the cache,
#                                             # decode-graph, module and compile GPU tests (report named
#                                             # after REV), then the decode step (eager, DecodeGraph;
#                                             # 4k and 32k at batch 1, DecodeGraph at 4k and batch 16) of
#                                             # this tree against OLD_SRC (src/ before it, untracked),
#                                             # three times in turn, and the step's kernels
#   bash scripts/gpu_session39.sh sweep REV OLD_SRC  # the emission alone in launch variants
#                                             # (gpu_mlp_emission.py; the first launches took 14 + 5 us
#                                             # of the step), the cache GPU tests, then DecodeGraph steps
#                                             # (4k, 32k) of this tree against OLD_SRC three times in
#                                             # turn, and the step's kernels
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session39.sh emission|sweep REV OLD_SRC}"
device_line
case "$step" in
emission)
    rev="${2:?the commit to name the report after}"
    old="${3:?the folder holding the previous src/ (nsa) for the A/B}"
    verbose_tests 240 "$rev" emission tests/test_cache.py tests/test_decode_graph.py tests/test_module.py \
        tests/test_compile.py
    decode_rounds "$old" 60 emission --ways eager,DecodeGraph
    decode_rounds "$old" 60 emission_b16 --ways DecodeGraph --batch 16 --contexts 4096
    step_profile
    ;;
sweep)
    rev="${2:?the commit to name the report after}"
    old="${3:?the folder holding the previous src/ (nsa) for the A/B}"
    timeout 200 python scripts/gpu_mlp_emission.py 2>&1 | tee "$OUT/mlp_emission.md" | grep -v "^$"
    verbose_tests 120 "$rev" sweep tests/test_cache.py
    decode_rounds "$old" 60 sweep --ways DecodeGraph
    step_profile
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
