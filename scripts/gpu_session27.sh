#!/bin/bash
# The GPU calls of session 27 (docs/perf/other_gpus.md):
#
#   bash scripts/gpu_session27.sh sizing     # the launches sized for an A100 and an RTX 4090
#                                            # (nsa.ops._triton.device.sized_as) run on this GPU:
#                                            # prefill and decode against the reference at real sizes,
#                                            # and the CPU-side sizing tests
#   bash scripts/gpu_session27.sh errors     # scripts/gpu_sizing_errors.py: the bf16 prefill's errors
#                                            # against the float32 reference, sized for each GPU
#   bash scripts/gpu_session27.sh suite REV  # the whole suite but the benchmarks on 12 workers, from
#                                            # an empty Triton cache, the report named after REV
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: scripts/gpu_session27.sh sizing|errors|suite REV}"
device_line
case "$step" in
sizing)
    start=$(date +%s)
    run_group launches 60 2 tests/ops/test_launch_sizing.py \
        "tests/ops/test_nsa_attention_kernel.py::test_nsa_attention_sized_for_other_gpus"
    run_group prefill 200 2 "tests/ops/test_nsa_attention_kernel.py::test_nsa_attention_sized_for_other_gpus_real_size"
    run_group decode 150 2 "tests/ops/test_decode_kernel.py::test_decode_sized_for_other_gpus_real_size"
    ;;
errors)
    # bf16 prefill errors against the float32 reference, launches sized for this GPU and the others
    timeout 240 python scripts/gpu_sizing_errors.py --shapes 4173:16:1:128:128 3001:16:16:128:128 \
        2053:16:1:192:128 2>&1 | tee "$OUT/sizing_errors.md"
    ;;
suite)
    export TRITON_CACHE_DIR=/tmp/triton_cache_suite
    rm -rf "$TRITON_CACHE_DIR"
    start=$(date +%s)
    timeout 570 python -m pytest -q -p no:cacheprovider -n 12 --dist worksteal -m "not benchmark" --gpu-profile auto \
        --nsa-report="$OUT" --nsa-report-commit "${2:?the commit to name the report after}" 2>&1 | tail -12
    echo "suite: $(( $(date +%s) - start )) s" | tee "$OUT/suite_time.txt"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
