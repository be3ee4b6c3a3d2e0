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
#   bash scripts/gpu_session39.sh final REV OLD_SRC LOOP_SRC  # the emission's second launch reading
#                                             # every split at once: the cache, decode-graph, module and
#                                             # compile GPU tests, then DecodeGraph steps (4k and 32k at
#                                             # batch 1, twice; 4k at batch 16, once) of OLD_SRC (src/
#                                             # before the emission), LOOP_SRC (this src/ with the
#                                             # split-by-split launch of the first call) and this tree,
#                                             # in turn; the step's kernels
#   bash scripts/gpu_session39.sh pending REV OLD_SRC  # next session's first call (after the device
#                                             # time was spent): step positions in two ops, and the
#                                             # second product apart by hidden chunk in three launches
#                                             # (docs/perf/attempts/decode_emission_second_product_apart.patch,
#                                             # applied to a copy of src/ in apart_src/): the cache,
#                                             # decode-graph and module GPU tests, then the cache and
#                                             # decode-graph ones on apart_src, then DecodeGraph steps
#                                             # (4k and 32k at batch 1, three times; 4k at batch 16) of
#                                             # OLD_SRC (src/ of de6454b, before both), this tree ("new")
#                                             # and apart_src in turn, and apart_src's step kernels
#
# Two more calls ran this script's step "sweep" as it stood at e2dadd0 and 005cf99 (see `git show
# 005cf99:scripts/gpu_session39.sh`): the emission alone in launch variants
# (scripts/gpu_mlp_emission.py of those commits, with the launch overrides they had), the cache GPU
# tests, and DecodeGraph steps against OLD_SRC. No variant beat this launch inside a step, so the
# overrides and that script went (docs/perf/compile.md, "Session 39").
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session39.sh emission REV OLD_SRC | final REV OLD_SRC LOOP_SRC | pending REV OLD_SRC}"
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
final)
    rev="${2:?the commit to name the report after}"
    sides=([old]="${3:?the folder of src/ before the emission}" [loop]="${4:?the folder of src/ with the split loop}")
    tests_and_steps 200 "$rev" final "tests/test_cache.py tests/test_decode_graph.py tests/test_module.py
        tests/test_compile.py" "old loop new" "--ways DecodeGraph" "--ways DecodeGraph" \
        "--ways DecodeGraph --batch 16 --contexts 4096"
    ;;
pending)
    rev="${2:?the commit to name the report after}"
    rm -rf apart_src && mkdir apart_src && cp -r src/nsa apart_src/ \
        && patch -p2 -d apart_src < docs/perf/attempts/decode_emission_second_product_apart.patch || exit 1
    sides=([old]="${3:?the folder of src/ of de6454b}" [apart]=apart_src)
    verbose_tests 200 "$rev" pending tests/test_cache.py tests/test_decode_graph.py tests/test_module.py
    # as run (session 40's first call) this found no pytest_nsa (src/ not on the path) and ran no
    # test; session 40's second call ran the GPU tests on the tree with the change adopted
    PYTHONPATH="$PWD/apart_src:$PWD/scripts" verbose_tests 120 "$rev" apart tests/test_cache.py tests/test_decode_graph.py
    side_rounds pending "old new apart" "--ways DecodeGraph" "--ways DecodeGraph" "--ways DecodeGraph" \
        "--ways DecodeGraph --batch 16 --contexts 4096"
    PYTHONPATH="$PWD/apart_src:$PWD/scripts" step_profile
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
