#!/bin/bash
# The GPU calls of session 38: session 37's pending validation, the one-launch cache write timed
# against the six writes it replaced.
#
#   bash scripts/gpu_session38.sh first REV OLD_SRC  # the kernel, module, compile, cache and decode-graph
#                                             # GPU tests (report named after REV; launch sizes as host
#                                             # arithmetic, the cache's six writes in one launch, token
#                                             # reads computed when read), then the layer's decode step
#                                             # (gpu_decode_compiled.py: eager and DecodeGraph, 4k and 32k)
#                                             # of this tree against OLD_SRC (src/ before the one-launch
#                                             # write, untracked), twice in turn
#                                             # (the tests ran out of time at 81 %, none failed: hence
#                                             # the next two steps, verbose)
#   bash scripts/gpu_session38.sh second REV  # the module, compile, cache and decode-graph GPU tests, the
#                                             # launch-size and decode-kernel ones; gpu_host_cost.py (the
#                                             # host's share after the launch sizes left Triton's constexpr
#                                             # helpers), every way of the decode step at 4k
#                                             # (gpu_decode_compiled.py) and its kernels
#                                             # (gpu_decode_step_profile.py)
#   bash scripts/gpu_session38.sh kernels REV # the other kernel GPU tests (tests/ops)
#   bash scripts/gpu_session38.sh rows REV OLD_SRC  # the emission's blocks gathered and its tokens stored
#                                             # in one launch each, RoPE's tables in one: their GPU tests
#                                             # (cache, rotary, module, decode graph, compile, varlen), then
#                                             # the decode step (eager, reduce-overhead, DecodeGraph at 4k)
#                                             # and eager layer calls of this tree against OLD_SRC
#                                             # (src/ before them, untracked), twice in turn; the step's
#                                             # kernels, every one
#   bash scripts/gpu_session38.sh views REV OLD_SRC  # a decode step's values written from views of the
#                                             # projection, the gathered blocks laid out heads first (the
#                                             # compression reads them without a copy): the same as rows
#   bash scripts/gpu_session38.sh replays OLD_SRC  # reduce-overhead and DecodeGraph steps at 4k, OLD_SRC
#                                             # (src/ of the session's start) against this tree, three
#                                             # times in turn, the old first (the new side ran first and
#                                             # slower under reduce-overhead in rows and views)
#   bash scripts/gpu_session38.sh pending REV OLD_SRC  # next session's first call: what ran on no GPU
#                                             # after the device time was spent (a decode step rotates its
#                                             # queries and keys in one launch, all of them views of the
#                                             # projection): the module, decode-graph, cache and rotary GPU
#                                             # tests, then the decode step (eager, DecodeGraph at 4k and
#                                             # 32k) against OLD_SRC (src/ of 80109a9) three times in turn,
#                                             # and the step's kernels
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session38.sh first REV OLD_SRC | second REV | kernels REV | rows REV OLD_SRC | views REV OLD_SRC | replays OLD_SRC | pending REV OLD_SRC}"
device_line
case "$step" in
first)
    rev="${2:?the commit to name the report after}"
    old="${3:?the folder holding the previous src/ (nsa) for the A/B}"
    worker_tests 330 "$rev" tests/ops tests/test_module.py tests/test_compile.py tests/test_decode_graph.py \
        tests/test_cache.py
    for side in new old new old; do
        ab_side "$side" "$old"
        PYTHONPATH="$side_src:$PWD/scripts" timeout 60 python "$here/gpu_decode_compiled.py" \
            --ways eager,DecodeGraph 2>&1 | grep "^|" | tee -a "$OUT/cache_write_decode_$side.md"
    done
    ;;
second)
    rev="${2:?the commit to name the report after}"
    verbose_tests 240 "$rev" second tests/test_module.py tests/test_compile.py tests/test_decode_graph.py \
        tests/test_cache.py tests/ops/test_launch_options.py tests/ops/test_decode_kernel.py
    timeout 200 python "$here/gpu_host_cost.py" --profile-dir "$OUT" 2>&1 | tee "$OUT/host_cost.md"
    timeout 90 python "$here/gpu_decode_compiled.py" --contexts 4096 2>&1 | grep "^|" | tee "$OUT/decode_compiled.md"
    step_profile
    ;;
rows | views)
    rev="${2:?the commit to name the report after}"
    old="${3:?the folder holding the previous src/ (nsa) for the A/B}"
    verbose_tests 200 "$rev" "$step" tests/test_cache.py tests/ops/test_rotary_kernel.py tests/test_module.py \
        tests/test_decode_graph.py tests/test_compile.py tests/test_varlen.py
    for side in new old new old; do
        ab_side "$side" "$old"
        PYTHONPATH="$side_src:$PWD/scripts" timeout 60 python "$here/gpu_decode_compiled.py" --contexts 4096 \
            --ways eager,reduce-overhead,DecodeGraph 2>&1 | grep "^|" | tee -a "$OUT/${step}_$side.md"
        PYTHONPATH="$side_src:$PWD/scripts" timeout 50 python "$here/gpu_host_cost.py" --cases layer,decode \
            --lengths 4096 --rounds 15 2>&1 | grep "^|" | tee -a "$OUT/${step}_$side.md"
    done
    step_profile
    ;;
pending)
    rev="${2:?the commit to name the report after}"
    old="${3:?the folder holding the previous src/ (nsa) for the A/B}"
    verbose_tests 240 "$rev" pending tests/test_module.py tests/test_decode_graph.py tests/test_cache.py \
        tests/ops/test_rotary_kernel.py tests/ops/test_decode_kernel.py
    decode_rounds "$old" 60 pending --ways eager,DecodeGraph
    step_profile
    ;;
replays)
    old="${2:?the folder holding the previous src/ (nsa) for the A/B}"
    decode_rounds "$old" 45 replays --contexts 4096 --ways reduce-overhead,DecodeGraph
    ;;
kernels)
    rev="${2:?the commit to name the report after}"
    verbose_tests 500 "$rev" kernels tests/ops --ignore=tests/ops/test_launch_options.py \
        --ignore=tests/ops/test_decode_kernel.py
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
