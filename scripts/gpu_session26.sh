#!/bin/bash
# The GPU calls of session 26 (docs/perf/float32.md):
#
#   bash scripts/gpu_session26.sh suite REV [PRECISION]  # the whole suite but the benchmarks on 12
#                                            # workers, from an empty Triton cache, the report named after
#                                            # REV, with NSA_FLOAT32_DOT=PRECISION (default auto: exact
#                                            # float32 at torch's default). Run at eca6a4c with tf32x3
#                                            # (every float32 test at its float32 tolerance on tensor
#                                            # cores) and at 5a3c4dd with auto
#   bash scripts/gpu_session26.sh tests      # with NSA_FLOAT32_DOT=tf32x3: the float32 precision tests
#                                            # (tensor-core float32 against the float64 reference at head
#                                            # dim 128) and the window's tile choice
#   bash scripts/gpu_session26.sh listing tf32x3 tf32   # each op's compile and call times in float32 at
#   bash scripts/gpu_session26.sh listing bf16 ieee     # each precision (ieee: compressed and selected
#                                            # attention alone) or in bfloat16, head dim 128, T = 4096,
#                                            # each from an empty Triton cache, with the kernels'
#                                            # registers and spills
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: scripts/gpu_session26.sh suite REV [PRECISION]|tests|listing NAME...}"
device_line
case "$step" in
suite)
    export TRITON_CACHE_DIR=/tmp/triton_cache_suite NSA_FLOAT32_DOT="${3:-auto}"
    rm -rf "$TRITON_CACHE_DIR"
    start=$(date +%s)
    timeout 560 python -m pytest -q -p no:cacheprovider -n 12 --dist worksteal -m "not benchmark" --gpu-profile auto \
        --nsa-report "$OUT" --nsa-report-commit "${2:?the commit to name the report after}" 2>&1 | tail -12
    echo "suite with NSA_FLOAT32_DOT=$NSA_FLOAT32_DOT: $(( $(date +%s) - start )) s" | tee "$OUT/suite_time.txt"
    ;;
tests)
    NSA_FLOAT32_DOT=tf32x3 timeout 300 python -m pytest -q -p no:cacheprovider -n 3 --gpu-profile auto \
        tests/ops/test_float32_precision.py \
        tests/ops/test_window_kernel.py::test_window_dkdv_tiles_by_head_width_and_dtype 2>&1 | tail -4
    ;;
listing)
    shift
    for name in "$@"; do  # each listing from an empty cache
        export TRITON_CACHE_DIR="/tmp/triton_cache_$name"
        rm -rf "$TRITON_CACHE_DIR"
        case "$name" in
        bf16) args=(--dtypes bfloat16) precision=auto ;;
        ieee) args=(--dtypes float32 --ops compressed_attention selected_attention) precision=ieee ;;
        *) args=(--dtypes float32) precision="$name" ;;
        esac
        NSA_FLOAT32_DOT="$precision" timeout 240 python scripts/gpu_kernels_by_dtype.py --dims 128:128 --T 4096 \
            "${args[@]}" 2>&1 | tee "$OUT/listing_$name.md" | grep -v "^- "
    done
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
