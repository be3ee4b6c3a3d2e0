#!/bin/bash
# The GPU calls of session 35: the prefill forward by its inputs' memory layout, the GPU tests that
# session 34 wrote and could not run (prompts of different lengths into a static cache, dense
# varlen_attn in the packed runner), nsa-bench packed, and the issue tables on the machine lent.
#
#   bash scripts/gpu_session35.sh first REV   # scripts/gpu_layout.py (8k, 16k, 64k), then the GPU tests
#                                             # of the decode graph, the cache, packed batches and
#                                             # nsa.bench (report named after REV)
#   bash scripts/gpu_session35.sh tables      # nsa-bench packed, prefill and decode (graph replay,
#                                             # batch 1 and 16), the profile matching the GPU; CSVs and plots
#   NO_PACKED=1 bash scripts/gpu_session35.sh tables   # prefill and decode only (the second call, after
#                                             # STEPS=pytest scripts/gpu_record.sh saved the baseline
#                                             # that the plots draw)
#   bash scripts/gpu_session35.sh pending REV # what the session changed after its device time ran out:
#                                             # the module, decode graph, cache, compile and varlen GPU
#                                             # tests (RoPE in float64, the autocast cache, the device
#                                             # guard; on a two-GPU kind the guard's own test runs too)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session35.sh first REV | tables | pending REV}"
device_line
case "$step" in
first)
    rev="${2:?the commit to name the report after}"
    timeout 240 python "$here/gpu_layout.py" 2>&1 | tee "$OUT/layout.md" | grep -v "^$"
    echo "== layout probe after $(( $(date +%s) - start )) s"
    timeout 280 python -m pytest -q -p no:cacheprovider -n 8 --dist worksteal -m "not benchmark" --gpu-profile auto \
        -rfEs --tb=short --nsa-report="$OUT" --nsa-report-commit "$rev" \
        tests/test_decode_graph.py tests/test_cache.py tests/test_varlen.py tests/bench > "$OUT/tests.txt" 2>&1
    echo "== tests: rc $? after $(( $(date +%s) - start )) s"
    grep -E "FAILED|ERROR" "$OUT/tests.txt" | head -20
    tail -4 "$OUT/tests.txt"
    ;;
tables)
    name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z_')
    [ -n "${NO_PACKED:-}" ] || timeout 150 python -m nsa.bench packed --budget 3 --csv "$OUT/packed_$name.csv" 2>&1 | tail -8
    timeout 230 python -m nsa.bench prefill --budget 4 --csv "$OUT/prefill_$name.csv" --plot "$OUT/prefill_$name.png" \
        2>&1 | tail -8
    timeout 180 python -m nsa.bench decode --batch 1,16 --graph --budget 4 --csv "$OUT/decode_$name.csv" \
        --plot "$OUT/decode_$name.png" 2>&1 | tail -14
    ;;
pending)
    rev="${2:?the commit to name the report after}"
    timeout 560 python -m pytest -q -p no:cacheprovider -n 8 --dist worksteal -m "not benchmark" --gpu-profile auto \
        -rfEs --tb=short --nsa-report="$OUT" --nsa-report-commit "$rev" tests/test_module.py tests/test_decode_graph.py \
        tests/test_cache.py tests/test_compile.py tests/test_varlen.py > "$OUT/pending.txt" 2>&1
    echo "== pending: rc $? after $(( $(date +%s) - start )) s"
    grep -E "FAILED|ERROR" "$OUT/pending.txt" | head -20
    tail -4 "$OUT/pending.txt"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
