#!/bin/bash
# The GPU calls of session 14 (docs/perf/prefill.md, "Session 14"), one step per call:
#
#   bash scripts/gpu_session14.sh ncu           # Nsight Compute on the compressed forward (the saved
#                                               # copy scripts/_old_compressed_fwd.py and now), its
#                                               # parts, the top-n launches up to 128k, kernel times
#   bash scripts/gpu_session14.sh ab            # whole prefill against ab_base/ (extract the tree
#                                               # first: git archive <rev> src | tar -x -C ab_base),
#                                               # then every kernel's time in one forward+backward
#   bash scripts/gpu_session14.sh parts         # compressed forward against the saved copy, by parts
#   bash scripts/gpu_session14.sh final <rev>   # the H100 table, then the GPU tests of the changed
#                                               # kernels, the report named after <rev>
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
case "${1:?usage: scripts/gpu_session14.sh ncu|ab|parts|final REV}" in
ncu)
    NCU="ncu --profile-from-start off --clock-control none -k regex:compressed_fwd_kernel --set full --import-source no"
    for v in old new; do
        mod=""
        if [ "$v" = old ]; then
            [ -f scripts/_old_compressed_fwd.py ] || continue  # the saved copy, not committed
            mod="--module scripts/_old_compressed_fwd.py"
        fi
        $NCU -o /tmp/cmp_$v python scripts/ncu_compressed_fwd.py --length 16384 $mod > "$OUT/ncu_run_$v.txt" 2>&1
        ncu -i /tmp/cmp_$v.ncu-rep --page details > "$OUT/ncu_details_$v.txt" 2>&1
        ncu -i /tmp/cmp_$v.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_sass_$v.csv" 2>&1
    done
    python scripts/gpu_prefill_probe.py --only cmp cmp_parts topn kernels --lengths 8192 65536 2>&1 | tee "$OUT/probe.txt"
    python scripts/gpu_prefill_probe.py --only topn --lengths 131072 2>&1 | tee -a "$OUT/probe.txt"
    ;;
ab)
    BUDGET=4 bash scripts/gpu_ab_prefill.sh ab_base 8192,65536 2 2>&1 | grep -v "^batch\|^    1 " | tee "$OUT/ab.txt"
    python scripts/gpu_prefill_probe.py --only kernels --lengths 8192 65536 2>&1 | tee "$OUT/probe.txt"
    ;;
parts)
    python scripts/gpu_prefill_probe.py --only cmp cmp_parts --lengths 8192 65536 2>&1 | tee "$OUT/probe.txt"
    ;;
final)
    python -m nsa.bench prefill --profile h100 --budget 4 --csv "$OUT/prefill_h100.csv" --plot "$OUT/prefill_h100.png" 2>&1 | tail -8
    timeout 560 python -m pytest -q -n 3 -m "not benchmark" --gpu-profile auto --nsa-report "$OUT" \
        --nsa-report-commit "${2:?final needs the commit to name the report after}" \
        tests/ops/test_compressed_kernel.py tests/ops/test_select_kernel.py tests/ops/test_window_kernel.py \
        tests/ops/test_selected_kernel.py tests/ops/test_nsa_attention_kernel.py 2>&1 | tail -8
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
