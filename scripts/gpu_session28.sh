#!/bin/bash
# The GPU calls of session 28 (selections compared on their own terms, outputs given the same
# blocks: nsa.testing.assert_valid_selection / nsa_attention_with_blocks):
#
#   bash scripts/gpu_session28.sh parity     # the real-size parity tests that take the new checks:
#                                            # prefill (own and sized launches), decode (own, sized,
#                                            # float32 at head dim 128), selection
#   bash scripts/gpu_session28.sh recheck    # the tests changed after those: the real-size prefill cases
#                                            # alone, the decode graph, the spec oracle, the report guard
#   bash scripts/gpu_session28.sh errors     # scripts/gpu_sizing_errors.py: errors given the kernels'
#                                            # blocks, swapped rows, o against the reference's own blocks
#   bash scripts/gpu_session28.sh suite REV NAME [PATH...]
#                                            # the suite (or PATHs of it) but the benchmarks on 12
#                                            # workers, from an empty Triton cache, the report named
#                                            # after REV; each test's outcome is written as it ends
#                                            # (suite_NAME.txt), so a run cut short still names its
#                                            # failures. The whole suite passed 600 s in this session:
#                                            # it runs in two parts (ops kernels; the rest)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: scripts/gpu_session28.sh parity|recheck|errors|suite REV NAME [PATH...]}"
device_line
start=$(date +%s)
case "$step" in
parity)
    run_group prefill 300 3 "tests/ops/test_nsa_attention_kernel.py::test_nsa_attention_triton_bf16_real_size" \
        "tests/ops/test_nsa_attention_kernel.py::test_nsa_attention_sized_for_other_gpus_real_size"
    run_group decode 200 3 "tests/ops/test_decode_kernel.py::test_decode_bf16_real_sizes" \
        "tests/ops/test_decode_kernel.py::test_decode_sized_for_other_gpus_real_size" \
        "tests/ops/test_decode_kernel.py::test_decode_float32_head_dim_128_on_gpu"
    run_group select 90 3 "tests/ops/test_select_kernel.py::test_select_gpu_bf16"
    ;;
recheck)
    # after the first calls: the real-size prefill cases alone on the GPU (requires(memory_gib)),
    # the decode graph and the spec oracle with the selection checks, the --nsa-report guard
    run_group prefill 200 3 "tests/ops/test_nsa_attention_kernel.py::test_nsa_attention_triton_bf16_real_size"
    run_group graph_oracle 150 3 tests/test_decode_graph.py tests/test_selection.py tests/test_testing.py \
        tests/plugin/test_report.py
    ;;
errors)
    timeout 300 python scripts/gpu_sizing_errors.py --shapes 4173:16:1:128:128 4173:64:4:128:128 \
        4111:16:4:128:128 3001:16:16:128:128 2053:16:1:192:128 2>&1 | tee "$OUT/sizing_errors.md"
    ;;
suite)
    export TRITON_CACHE_DIR=/tmp/triton_cache_suite
    rm -rf "$TRITON_CACHE_DIR"
    rev="${2:?the commit to name the report after}" name="${3:?a name for this part}"
    shift 3
    timeout 560 python -m pytest -v -p no:cacheprovider -n 12 --dist worksteal -m "not benchmark" --gpu-profile auto \
        -rfE --tb=short -p pytest_failures_now --nsa-report="$OUT" --nsa-report-commit "$rev" "$@" > "$OUT/suite_$name.txt" 2>&1
    echo "suite $name: rc $?, $(( $(date +%s) - start )) s" | tee -a "$OUT/suite_time.txt"
    grep -E "FAILED|ERROR" "$OUT/suite_$name.txt" | head -20
    tail -4 "$OUT/suite_$name.txt"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
