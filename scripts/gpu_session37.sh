#!/bin/bash
# The GPU calls of session 37: session 36's pending validation, and the host's cost of a call.
#
#   bash scripts/gpu_session37.sh first REV   # session 36's pending tests (nsa::rotary under compile, the
#                                             # rotary kernel in decode graphs, cache, varlen; report named
#                                             # after REV), gpu_host_cost.py
#                                             # (host against device time of each call, cProfiles at 4k),
#                                             # then gpu_compile.py at 16k
#   bash scripts/gpu_session37.sh graphs REV  # torch.compile(mode="reduce-overhead"): the compile tests (the
#                                             # new CUDA-graph ones among them), gpu_compile.py in that mode at
#                                             # 1k and 4k, and in the default mode at 1k
#   bash scripts/gpu_session37.sh decode REV  # after the static cache marked its buffers static addresses:
#                                             # the compile, cache and decode-graph tests, then
#                                             # gpu_decode_compiled.py (eager, compiled, reduce-overhead,
#                                             # DecodeGraph steps) at 4k and 32k
#   bash scripts/gpu_session37.sh fused REV OLD_SRC  # one in_proj for the queries, keys and values: the
#                                             # module, compile, cache, decode-graph and varlen tests; then
#                                             # decode steps (gpu_decode_compiled.py) and eager layer calls
#                                             # (gpu_host_cost.py) of this tree against OLD_SRC (a copy of
#                                             # the previous src/, untracked), twice in turn
#   bash scripts/gpu_session37.sh split REV OLD_SRC  # in_proj's parts split and made contiguous (the views
#                                             # slowed the kernels and the backward): the decode steps and
#                                             # layer calls against OLD_SRC once, then the module and
#                                             # decode-graph tests (the last of the session's device time)
#   bash scripts/gpu_session37.sh pending REV # next session's first call: what ran on no GPU after the device
#                                             # time was spent (launch sizes as host arithmetic in every
#                                             # wrapper; the cache's six writes in one launch; token reads
#                                             # computed when read): the kernel, module, compile, cache and
#                                             # decode-graph GPU tests,
#                                             # gpu_host_cost.py again (the host's share after it), and the
#                                             # layer's decode step (gpu_decode_compiled.py) at 4k and 32k
#                                             # and its kernels (gpu_decode_step_profile.py)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session37.sh first REV | graphs REV | decode REV | fused REV OLD_SRC | split REV OLD_SRC | pending REV}"
device_line
case "$step" in
first)
    rev="${2:?the commit to name the report after}"
    worker_tests 300 "$rev" tests/ops/test_rotary_kernel.py tests/test_module.py tests/test_compile.py \
        tests/test_decode_graph.py tests/test_cache.py tests/test_varlen.py
    timeout 200 python "$here/gpu_host_cost.py" --profile-dir "$OUT" 2>&1 | tee "$OUT/host_cost.md"
    echo "== host cost after $(( $(date +%s) - start )) s"
    timeout 150 python "$here/gpu_compile.py" --length 16384 2>&1 | tee "$OUT/compile_16384.md" | grep "^|"
    ;;
graphs)
    rev="${2:?the commit to name the report after}"
    worker_tests 200 "$rev" tests/test_compile.py
    compile_runs 170 mode "1024 reduce-overhead" "4096 reduce-overhead" "1024 default"
    ;;
decode)
    rev="${2:?the commit to name the report after}"
    worker_tests 240 "$rev" tests/test_compile.py tests/test_cache.py tests/test_decode_graph.py
    timeout 240 python "$here/gpu_decode_compiled.py" 2>&1 | tee "$OUT/decode_compiled.md" | grep -v "^$"
    ;;
fused)
    rev="${2:?the commit to name the report after}"
    old="${3:?the folder holding the previous src/ (nsa) for the A/B}"
    worker_tests 240 "$rev" tests/test_module.py tests/test_compile.py tests/test_cache.py tests/test_decode_graph.py \
        tests/test_varlen.py
    for side in new old new old; do
        ab_side "$side" "$old"
        PYTHONPATH="$side_src:$PWD/scripts" timeout 100 python "$here/gpu_decode_compiled.py" --contexts 4096 \
            --ways eager,reduce-overhead,DecodeGraph 2>&1 | grep "^|" | tee -a "$OUT/fused_decode_$side.md"
        PYTHONPATH="$side_src:$PWD/scripts" timeout 100 python "$here/gpu_host_cost.py" --cases layer,layer_train \
            --lengths 4096,16384 --rounds 15 2>&1 | grep "^|" | tee -a "$OUT/fused_layer_$side.md"
    done
    ;;
split)
    rev="${2:?the commit to name the report after}"
    old="${3:?the folder holding the previous src/ (nsa) for the A/B}"
    for side in new old; do
        ab_side "$side" "$old"
        PYTHONPATH="$side_src:$PWD/scripts" timeout 50 python "$here/gpu_decode_compiled.py" --contexts 4096 \
            --ways reduce-overhead,DecodeGraph 2>&1 | grep "^|" | tee -a "$OUT/split_decode_$side.md"
        PYTHONPATH="$side_src:$PWD/scripts" timeout 60 python "$here/gpu_host_cost.py" --cases layer,layer_train \
            --lengths 4096,16384 --rounds 15 2>&1 | grep "^|" | tee -a "$OUT/split_layer_$side.md"
    done
    worker_tests 80 "$rev" tests/test_module.py tests/test_decode_graph.py
    ;;
pending)
    rev="${2:?the commit to name the report after}"
    worker_tests 330 "$rev" tests/ops tests/test_module.py tests/test_compile.py tests/test_decode_graph.py \
        tests/test_cache.py
    timeout 200 python "$here/gpu_host_cost.py" --profile-dir "$OUT" 2>&1 | tee "$OUT/host_cost.md"
    timeout 120 python "$here/gpu_decode_compiled.py" 2>&1 | grep "^|" | tee "$OUT/decode_compiled.md"
    timeout 60 python "$here/gpu_decode_step_profile.py" 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning\|_warn_once" \
        | tee "$OUT/decode_step_profile.md" | grep "^###"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
