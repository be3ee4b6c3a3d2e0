#!/usr/bin/env bash
# The GPU calls of session 42: the decode op's launches on the H200, at the two points of the
# decode issue it misses there (batch 16 at 64k, 6.07x against 7x; batch 1 at 64k, 2.35x against
# 2.5x). Which launches start early (programmatic dependent launch, per launch) was timed at batch
# 1 only (H100, session 23); at batch 16 PDL has been all off since session 4, when all on measured
# slower. The batch-1 splits were last swept on an H100 (session 21).
#
#   bash scripts/gpu_session42.sh sweep   # scripts/gpu_decode.py at batch 16 (8k, 64k) with PDL per
#                                         # launch, then at batch 1 (8k, 64k) with compressed and window
#                                         # splits; every variant checked against the float32 reference
#                                         # at 64k (batch 1, and batch 16 of unequal lengths)
#   bash scripts/gpu_session42.sh pdl     # batch 16, 32 and 64 at 8k-64k: PDL all on against all off
#                                         # (the default once the batch fills the GPU), in turn, twice
#   bash scripts/gpu_session42.sh stages  # the compressed launch at batch 16, 32, 64 (8k-64k), PDL on: one
#                                         # wave of 4 programs an SM in 2 stages (the default) against 3
#                                         # programs in 3 stages, in turn, twice; the GPU's memory clock
#                                         # and bus width as torch reports them
#   bash scripts/gpu_session42.sh more    # batch 1 (16k-64k): the window's splits in the selected launch
#                                         # (which start early under PDL and wait for nothing) against the
#                                         # compressed launch, and 2 window splits; batch 16 and 32 (8k,
#                                         # 64k): selected blocks a program and window splits; twice each
#   bash scripts/gpu_session42.sh final   # batch 16, 32, 64 (8k, 64k): one window split of 512 tokens and
#                                         # 4 selected blocks a program, against the defaults; twice each
#   bash scripts/gpu_session42.sh table REV   # PDL at every batch (1baefdd): the decode-kernel, decode-graph
#                                         # and cache GPU tests (report named after REV), then the decode
#                                         # table at batch 1, 16, 32 and 64 (nsa-bench, graph replay)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session42.sh sweep | pdl | stages | more | final | table REV}"
device_line
case "$step" in
sweep)
    b16=()
    for early in '[true, false, false]' '[false, true, false]' '[false, false, true]' '[true, false, true]' \
        '[false, true, true]' '[true, true, false]' 'true'; do
        b16+=(--launch "{\"pdl\": $early}")
    done
    b16+=(--launch '{"splits": [6, 2, 8], "cmp_stages": 3, "pdl": [true, false, false]}')
    timeout 280 python "$here/gpu_decode.py" --contexts 8192 65536 --batches 16 --check-contexts 65536 \
        --variants 8192 65536 --check-variants "${b16[@]}" --out "$OUT/decode_b16_pdl_h200.md" > "$OUT/b16.log" 2>&1
    echo "== batch 16: rc $? after $(( $(date +%s) - start )) s"
    grep -E "^\| (8192|65536) |^- B=" "$OUT/decode_b16_pdl_h200.md"
    b1=()
    for launch in '{"splits": [24, 4, 1]}' '{"splits": [32, 4, 1]}' '{"splits": [12, 4, 1]}' \
        '{"splits": [16, 2, 1]}' '{"splits": [16, 8, 1]}' '{"combine_heads": 1}' '{"cmp_warps": 8}'; do
        b1+=(--launch "$launch")
    done
    timeout 240 python "$here/gpu_decode.py" --contexts 8192 65536 --batches 1 --check-contexts 65536 \
        --variants 8192 65536 --check-variants "${b1[@]}" --out "$OUT/decode_b1_splits_h200.md" > "$OUT/b1.log" 2>&1
    echo "== batch 1: rc $? after $(( $(date +%s) - start )) s"
    grep -E "^\| (8192|65536) |^- B=" "$OUT/decode_b1_splits_h200.md"
    ;;
pdl)
    timeout 500 python "$here/gpu_decode.py" --contexts 8192 --batches 16 32 64 --check-contexts 8192 \
        --variants 8192 16384 32768 65536 --check-variants --launch '{"pdl": true}' --launch '{"pdl": false}' \
        --launch '{"pdl": true}' --out "$OUT/decode_fill_pdl_h200.md" > "$OUT/pdl.log" 2>&1
    echo "== pdl: rc $? after $(( $(date +%s) - start )) s"
    grep -E "^\| 8192 |^- B=|^Launch" "$OUT/decode_fill_pdl_h200.md"
    ;;
stages)
    python -c "import torch; p = torch.cuda.get_device_properties(0); print(p.name, p.multi_processor_count, 'SMs,',
        getattr(p, 'memory_clock_rate', '?'), 'kHz memory clock,', getattr(p, 'memory_bus_width', '?'), 'bit bus,',
        getattr(p, 'L2_cache_size', '?'), 'B L2')" | tee "$OUT/memory.txt"
    for case in "16 6" "32 3" "64 2" "64 1"; do
        set -- $case
        variant_rounds "stages_b$1_s$2" "$1" 4096 "8192 16384 32768 65536" 150 "{\"splits\": [$2, 2, 8], \"cmp_stages\": 3}"
    done
    ;;
more)
    variant_rounds more_b1 1 65536 "16384 32768 65536" 200 '{"window_in_selected": true}' '{"splits": [16, 2, 1]}' \
        '{"splits": [16, 2, 1], "window_in_selected": true}'
    for case in "16 6" "32 3"; do
        set -- $case
        variant_rounds "more_b$1" "$1" 65536 "8192 65536" 150 "{\"splits\": [$2, 2, 4]}" "{\"splits\": [$2, 4, 8]}" \
            "{\"splits\": [$2, 4, 4]}" "{\"splits\": [$2, 1, 8]}"
    done
    ;;
final)
    variant_rounds final_b16 16 8192 "8192 65536" 150 '{"splits": [6, 2, 4]}' '{"splits": [6, 1, 4]}' '{"splits": [6, 1, 8]}'
    variant_rounds final_b32 32 8192 "8192 65536" 150 '{"splits": [3, 1, 8]}' '{"splits": [3, 1, 4]}'
    variant_rounds final_b64 64 8192 "8192 65536" 150 '{"splits": [1, 1, 8]}'
    ;;
table)
    rev="${2:?the commit to name the report after}"
    timeout 330 python -m pytest -q -p no:cacheprovider -n 8 --dist worksteal -m "not benchmark" --gpu-profile auto \
        -rfEs --tb=short --nsa-report="$OUT" --nsa-report-commit "$rev" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py tests/test_cache.py > "$OUT/tests.txt" 2>&1
    echo "== tests: rc $? after $(( $(date +%s) - start )) s"
    grep -E "FAILED|ERROR" "$OUT/tests.txt" | head -20
    tail -3 "$OUT/tests.txt"
    timeout 240 python -m nsa.bench decode --profile h200 --batch 1,16,32,64 --graph --budget 4 \
        --csv "$OUT/decode_h200.csv" --plot "$OUT/decode_h200.png" 2>&1 | tail -30
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
