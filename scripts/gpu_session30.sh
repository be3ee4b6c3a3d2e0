#!/bin/bash
# The GPU calls of session 30: exact float32 (torch's default precision) at its own tiles
# (nsa.ops._triton.attention.EXACT_FLOAT32_TILES; docs/perf/float32.md).
#
#   bash scripts/gpu_session30.sh listing        # each op's first call (compiles included) and the
#                                                # median of 5 later calls in exact float32, T = 4096,
#                                                # from an empty Triton cache: every op at head dims
#                                                # 128/128 and 192/128 with the library's tiles, then
#                                                # compressed and selected attention at 128/128 with the
#                                                # 16-bit inputs' tiles (--tuned-tiles, as before); the
#                                                # errors against the float64 reference
#                                                # (gpu_float32_check.py); bfloat16 for scale
#   bash scripts/gpu_session30.sh wide           # after exact float32 took twice the warps for heads
#                                                # wider than 128: its errors at 192/128 against the
#                                                # float64 reference and the GPU tests at those dims
#   bash scripts/gpu_session30.sh suite REV PART # one part of the suite but the benchmarks, 12 workers,
#                                                # empty Triton cache (gpu_session28.sh suite); with
#                                                # exact float32's own tiles two parts fit the device's
#                                                # 10 minutes: kernels (the prefill, compressed and
#                                                # window kernel files, 313 s) and rest (236 s)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session30.sh listing | suite REV PART}"
device_line
case "$step" in
listing)
    listing() {  # listing NAME ARGS...: one listing from an empty Triton cache
        local name="$1"
        shift
        export TRITON_CACHE_DIR="/tmp/triton_cache_$name"
        rm -rf "$TRITON_CACHE_DIR"
        NSA_FLOAT32_DOT=ieee timeout 200 python "$here/gpu_kernels_by_dtype.py" --T 4096 --repeat 5 "$@" 2>&1 \
            | tee "$OUT/listing_$name.md" | grep -v "^- "
    }
    listing exact --dtypes float32 --dims 128:128 192:128
    listing tuned --dtypes float32 --dims 128:128 --ops compressed_attention selected_attention --tuned-tiles
    listing bf16 --dtypes bfloat16 --dims 128:128
    export TRITON_CACHE_DIR=/tmp/triton_cache_exact
    timeout 120 python "$here/gpu_float32_check.py" --precisions ieee 2>&1 | tee "$OUT/float32_check.md" | tail -30
    ;;
wide)
    export TRITON_CACHE_DIR=/tmp/triton_cache_wide
    rm -rf "$TRITON_CACHE_DIR"
    timeout 150 python "$here/gpu_float32_check.py" --precisions ieee --dims 192:128 2>&1 \
        | tee "$OUT/float32_check_wide.md" | tail -14
    timeout 200 python -m pytest -q -p no:cacheprovider -n 8 --gpu-profile auto -rs --durations=10 \
        -k "float32_wide_heads or dk192 or DK192" tests/ops/test_window_kernel.py tests/ops/test_compressed_kernel.py \
        tests/ops/test_selected_kernel.py tests/ops/test_nsa_attention_kernel.py 2>&1 | tee "$OUT/tests_wide.txt" \
        | grep -v "^gw" | tail -24
    ;;
suite)
    rev="${2:?the commit to name the report after}"
    kernel_files=(tests/ops/test_nsa_attention_kernel.py tests/ops/test_compressed_kernel.py tests/ops/test_window_kernel.py)
    case "${3:?which part: kernels or rest}" in
    kernels) bash "$here/gpu_session28.sh" suite "$rev" kernels "${kernel_files[@]}" ;;
    rest) bash "$here/gpu_session28.sh" suite "$rev" rest "${kernel_files[@]/#/--ignore=}" ;;
    *) echo "unknown part $3" >&2; exit 2 ;;
    esac
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
