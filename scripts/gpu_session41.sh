#!/usr/bin/env bash
# The GPU calls of session 41. Its first call was `gpu_session40.sh pending`: of the three patches
# prepared in session 40, the gates in the combine launch held (32k steps 5 us shorter), the
# projections in row-product launches did not (4k and batch-16 steps 5-6 us longer), the rotation
# at the lengths in one launch gained 1-4 us on top of them.
#
#   bash scripts/gpu_session41.sh adopt REV BEFORE_SRC COMBINE_SRC  # this tree (the gates in the
#                                             # combine launch and the rotation at the lengths, the
#                                             # row product left out): the cache, decode-graph,
#                                             # module, compile, decode-kernel, gate-projection and
#                                             # rotary GPU tests, then DecodeGraph steps (4k and 32k
#                                             # at batch 1; 4k at batch 16; twice) of BEFORE_SRC
#                                             # (src/ of 55853e9), COMBINE_SRC (the gates alone) and
#                                             # this tree in turn; this tree's step kernels
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

usage="scripts/gpu_session41.sh adopt REV BEFORE_SRC COMBINE_SRC"
step="${1:?usage: $usage}"
device_line
rev="${2:?the commit to name the report after}"
one="--ways DecodeGraph" b16="--ways DecodeGraph --batch 16 --contexts 4096"
case "$step" in
adopt)
    sides=([before]="${3:?the folder of src/ of 55853e9}" [combine]="${4:?the folder of src/ with the gates alone}")
    tests_and_steps 240 "$rev" adopt "tests/test_cache.py tests/test_decode_graph.py tests/test_module.py
        tests/test_compile.py tests/ops/test_decode_kernel.py tests/ops/test_gate_projection.py
        tests/ops/test_rotary_kernel.py" "before combine new" "$one" "$b16" "$one" "$b16"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
