#!/usr/bin/env bash
# The GPU call of session 80 (H200): the selected kernels reading each block in key tiles, which a launch
# too large for the GPU's shared memory now falls back to (exact float32 with 128-key blocks and heads
# 192 wide, fuzz seed 103, asked 272 KiB of the H200's 227 in one stage), then prefill fuzz cases that
# session 79's script (run at 94489b4) did not reach in its time. The outputs are
# docs/perf/raw/session80_*.
#
#   bash scripts/gpu_session80.sh keytiles REV RANGE...  # the key-tile tests; fuzz prefill seed 103 in
#                                                       # float32, trained and not; then the fuzz cases
#                                                       # of each RANGE (FIRST-LAST prefill, decode:FIRST-LAST
#                                                       # decode) on 8 xdist workers until FUZZ_LIMIT s
#                                                       # (570) from the start; a report named after REV
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
keytiles)
    rev="${2:?keytiles needs the commit}"
    shift 2
    timeout 180 python -m pytest -p no:cacheprovider -q --gpu-profile auto -rfEs --tb=short \
        tests/ops/test_selected_kernel.py tests/ops/test_launch_sizing.py -k "key_tiles or smaller_launch or shared_memory" \
        > "$OUT/keytiles.txt" 2>&1
    echo "== key-tile tests: rc $? after $(( $(date +%s) - start )) s"
    tail -6 "$OUT/keytiles.txt"
    timeout 200 python scripts/fuzz_case.py prefill 103 --vary "dtype=float32" "dtype=float32;grad=True" \
        "dtype=float32;grad=True;lengths=(2000,)" 2>&1 | tee "$OUT/case.txt"
    echo "== case: after $(( $(date +%s) - start )) s"
    ids=() first=100000 last=0
    for range in "$@"; do
        test=test_fuzz_case
        [ "${range#decode:}" != "$range" ] && { test=test_fuzz_decode_case; range="${range#decode:}"; }
        for seed in $(seq "${range%-*}" "${range#*-}"); do
            ids+=("tests/test_fuzz.py::$test[seed$seed]")
            (( seed < first )) && first=$seed
            (( seed > last )) && last=$seed
        done
    done
    [ ${#ids[@]} -gt 0 ] || { echo "no fuzz ranges given"; exit 0; }
    fuzz_tests "$rev" "${FUZZ_LIMIT:-570}" --fuzz-seed "$first" --fuzz-cases $(( last - first + 1 )) "${ids[@]}"
    ;;
*)
    echo "usage: bash scripts/gpu_session80.sh keytiles REV RANGE..." >&2
    exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
