#!/bin/bash
# The GPU calls of session 36: NSA as torch.library custom ops (torch.compile with fullgraph=True,
# torch.export) and the learnable compression gathered heads first.
#
#   bash scripts/gpu_session36.sh first REV   # the GPU tests of compile, module, cache, decode graph,
#                                             # the whole-op kernels and packed batches (report named
#                                             # after REV); scripts/gpu_compile.py at 4k and 16k
#                                             # (eager against compiled, fullgraph); scripts/gpu_compression.py
#   bash scripts/gpu_session36.sh second REV  # after the first call's findings (RoPE broke the graph under
#                                             # compile; the gathered compression was slower): the same
#                                             # tests but the kernels' and packed batches', the compression
#                                             # timing, gpu_compile.py at 4k and 16k (bf16) and 4k (float32)
#   bash scripts/gpu_session36.sh third REV   # after the profile (scripts/gpu_compile_profile.py) found
#                                             # Inductor recomputing RoPE's float64 cos/sin per rotated
#                                             # element: compile and module tests, gpu_compile.py at 4k
#                                             # and 16k (bf16), the profile again at 16k
#   bash scripts/gpu_session36.sh rotary REV  # the Triton rotary embedding: its tests, the module and compile
#                                             # tests, scripts/gpu_rotary.py (alone and in an eager layer)
#   bash scripts/gpu_session36.sh pending REV # next session's first call: the rotary, compile, module, decode
#                                             # graph, cache and varlen tests after nsa::rotary (not yet on a
#                                             # GPU), gpu_compile.py at 16k
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session36.sh first REV | second REV | third REV | rotary REV | pending REV}"
device_line
case "$step" in
first)
    rev="${2:?the commit to name the report after}"
    worker_tests 300 "$rev" tests/test_compile.py tests/test_module.py tests/test_cache.py tests/test_decode_graph.py \
        tests/test_varlen.py tests/ops/test_nsa_attention_kernel.py
    timeout 100 python "$here/gpu_compression.py" 2>&1 | tee "$OUT/compression.md"
    echo "== compression after $(( $(date +%s) - start )) s"
    for length in 4096 16384; do
        timeout 150 python "$here/gpu_compile.py" --length "$length" 2>&1 | tee "$OUT/compile_$length.md" | grep -v "^$"
        echo "== compile $length after $(( $(date +%s) - start )) s"
    done
    ;;
second)
    rev="${2:?the commit to name the report after}"
    worker_tests 240 "$rev" tests/test_compile.py tests/test_module.py tests/test_cache.py tests/test_decode_graph.py
    timeout 100 python "$here/gpu_compression.py" 2>&1 | tee "$OUT/compression.md"
    compile_runs 150 dtype "4096 bfloat16" "16384 bfloat16" "4096 float32"
    ;;
third)
    rev="${2:?the commit to name the report after}"
    worker_tests 200 "$rev" tests/test_compile.py tests/test_module.py
    for length in 4096 16384; do
        timeout 150 python "$here/gpu_compile.py" --length "$length" 2>&1 | tee "$OUT/compile_$length.md" | grep "^|"
        echo "== compile $length after $(( $(date +%s) - start )) s"
    done
    timeout 120 python "$here/gpu_compile_profile.py" --length 16384 2>&1 | grep -v -i warn > "$OUT/compile_profile_16384.md"
    grep -A4 "^## compiled, forward" "$OUT/compile_profile_16384.md"
    ;;
rotary)
    rev="${2:?the commit to name the report after}"
    worker_tests 200 "$rev" tests/ops/test_rotary_kernel.py tests/test_module.py tests/test_compile.py
    timeout 120 python "$here/gpu_rotary.py" 2>&1 | tee "$OUT/rotary.md"
    ;;
pending)
    # what the session changed after its device time ran out: nsa::rotary under torch.compile; and
    # the rotary kernel inside captured decode steps and the cache, whose GPU tests it has not met
    rev="${2:?the commit to name the report after}"
    worker_tests 300 "$rev" tests/ops/test_rotary_kernel.py tests/test_module.py tests/test_compile.py \
        tests/test_decode_graph.py tests/test_cache.py tests/test_varlen.py
    timeout 150 python "$here/gpu_compile.py" --length 16384 2>&1 | tee "$OUT/compile_16384.md" | grep "^|"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
