#!/usr/bin/env bash
# The GPU calls of session 40 (its first call was `gpu_session39.sh pending`: the emission's
# second product apart by hidden chunk, three launches, 8 us shorter DecodeGraph steps; adopted).
#
#   bash scripts/gpu_session40.sh trims REV TWO_SRC THREE_SRC  # the cache, decode-graph, module and
#                                             # compile GPU tests of this tree (report named after
#                                             # REV), then DecodeGraph steps (4k and 32k at batch 1,
#                                             # twice; 4k at batch 16) of TWO_SRC (src/ of 529a88f:
#                                             # the emission in two launches), THREE_SRC (src/ of
#                                             # e85ed8c: in three) and this tree (also: the cache
#                                             # write advances seq_lens, step positions from offsets
#                                             # made once) in turn; this tree's step kernels
#   bash scripts/gpu_session40.sh pdl REV TRIMS_SRC PDL_SRC  # programmatic dependent launch in the
#                                             # step's emission and cache write: the cache,
#                                             # decode-graph, module, compile and decode-kernel GPU
#                                             # tests, then DecodeGraph steps as above of TRIMS_SRC
#                                             # (src/ of 97c78e8, no PDL there), PDL_SRC (src/ of
#                                             # 16c8185: the emission's launches) and this tree (the
#                                             # cache write's too) in turn; this tree's step kernels
#   bash scripts/gpu_session40.sh final REV TRIMS_SRC  # the tree as it ends (the emission's PDL, the
#                                             # cache write's dropped): the GPU tests of "pdl", then
#                                             # DecodeGraph steps as above of TRIMS_SRC and this tree
#                                             # in turn, twice; this tree's step kernels
#   bash scripts/gpu_session40.sh gates REV BEFORE_SRC  # a decode step's gates in one launch
#                                             # (nsa.ops.decode.gate_projection), started during the
#                                             # rotation: the GPU tests of "final" and the gate and
#                                             # rotary kernels', then DecodeGraph steps as in "final"
#                                             # of BEFORE_SRC (src/ of 79f2f17) and this tree
#   bash scripts/gpu_session40.sh pending REV  # next session's first call (prepared after the device
#                                             # time was spent), three patches of docs/perf/attempts
#                                             # applied in turn here on the GPU machine: the gates
#                                             # computed in the decode op's combine launch
#                                             # (decode_gates_in_combine.patch), the step's two
#                                             # projections in launches that read each weight once
#                                             # (decode_projections_row_product.patch), the rotation
#                                             # at the cache's lengths in one launch
#                                             # (decode_rotation_at_lengths.patch). src/ is copied
#                                             # before each (before_src/, combine_src/, rowprod_src/).
#                                             # The GPU tests of "final" and the patches' on the
#                                             # patched tree, then DecodeGraph steps as in "final" of
#                                             # the four trees in turn; the last one's step kernels.
#                                             # Ran in session 41; two of the patches landed (60f23d4)
#                                             # and left attempts/, so it runs in a checkout of
#                                             # 55853e9 only.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

usage="scripts/gpu_session40.sh trims REV TWO_SRC THREE_SRC | pdl REV TRIMS_SRC PDL_SRC | final REV TRIMS_SRC
    | gates REV BEFORE_SRC | pending REV"
step="${1:?usage: $usage}"
device_line
# the GPU test files of each step (the decode kernels' too from "pdl" on, for pdl_supported's move)
step_tests="tests/test_cache.py tests/test_decode_graph.py tests/test_module.py tests/test_compile.py"
rev="${2:?the commit to name the report after}"
one="--ways DecodeGraph" b16="--ways DecodeGraph --batch 16 --contexts 4096"
case "$step" in
trims)
    sides=([two]="${3:?the folder of src/ of 529a88f}" [three]="${4:?the folder of src/ of e85ed8c}")
    tests_and_steps 200 "$rev" trims "$step_tests" "two three new" "$one" "$one" "$b16"
    ;;
pdl)
    sides=([trims]="${3:?the folder of src/ of 97c78e8}" [pdl]="${4:?the folder of src/ of 16c8185}")
    tests_and_steps 240 "$rev" pdl "$step_tests tests/ops/test_decode_kernel.py" "trims pdl new" "$one" "$one" "$b16"
    ;;
final)
    sides=([trims]="${3:?the folder of src/ of 97c78e8}")
    tests_and_steps 240 "$rev" final "$step_tests tests/ops/test_decode_kernel.py" "trims new" \
        "$one" "$b16" "$one" "$b16"
    ;;
gates)
    sides=([before]="${3:?the folder of src/ of 79f2f17}")
    tests_and_steps 240 "$rev" gates "$step_tests tests/ops/test_decode_kernel.py tests/ops/test_gate_projection.py
        tests/ops/test_rotary_kernel.py" "before new" "$one" "$b16" "$one" "$b16"
    ;;
pending)
    attempts=docs/perf/attempts
    rm -rf before_src combine_src rowprod_src && mkdir before_src combine_src rowprod_src \
        && cp -r src/nsa before_src/ && patch -p1 < "$attempts/decode_gates_in_combine.patch" > /dev/null \
        && cp -r src/nsa combine_src/ && patch -p1 < "$attempts/decode_projections_row_product.patch" > /dev/null \
        && cp -r src/nsa rowprod_src/ && patch -p1 < "$attempts/decode_rotation_at_lengths.patch" > /dev/null \
        || exit 1
    sides=([before]=before_src [combine]=combine_src [rowprod]=rowprod_src)
    tests_and_steps 300 "$rev" pending "$step_tests tests/ops/test_decode_kernel.py tests/ops/test_gate_projection.py
        tests/ops/test_row_product.py tests/ops/test_rotary_kernel.py" "before combine rowprod new" \
        "$one" "$b16" "$one" "$b16"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
