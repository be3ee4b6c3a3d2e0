#!/usr/bin/env bash
# The GPU call of session 79 (H200): the differential fuzzer of tests/test_fuzz.py (tests/_fuzz.py) at
# GPU sizes. Each case is a random nsa_attention problem (geometry, groups, head widths, dtypes, chunked
# prefill, kv_cmp/kv_win, packed batches, inference or training) run on Triton and checked against the
# reference; most cases compile kernels of their own, so a call holds a few hundred at most. The
# outputs are docs/perf/raw/session79_fuzz_*.
#
#   bash scripts/gpu_session79.sh fuzz FIRST COUNT REV  # cases FIRST .. FIRST+COUNT-1, 8 xdist workers,
#                                                       # stopped (SIGINT: its summary still printed)
#                                                       # after 540 s; a report named after REV
#   bash scripts/gpu_session79.sh case KIND SEED VARY...  # one case by its seed and variants of it
#                                                       # (scripts/fuzz_case.py), then fuzz's arguments
#                                                       # after "--" if any: fuzz FIRST COUNT REV
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

fuzz_run() {
    local first="${1:?fuzz needs the first seed}" count="${2:?fuzz needs the number of cases}" rev="${3:?fuzz needs the commit}"
    fuzz_tests "$rev" "${FUZZ_LIMIT:-$(( $(date +%s) - start + 540 ))}" tests/test_fuzz.py --fuzz-seed "$first" \
        --fuzz-cases "$count"
}

case "$step" in
fuzz)
    fuzz_run "${@:2}"
    ;;
case)
    shift
    variants=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do variants+=("$1"); shift; done
    timeout 240 python scripts/fuzz_case.py "${variants[@]:0:2}" --vary "${variants[@]:2}" 2>&1 | tee -a "$OUT/case.txt"
    if [ "${1:-}" = "--" ]; then shift; FUZZ_LIMIT=570 fuzz_run "$@"; fi
    ;;
*)
    echo "usage: bash scripts/gpu_session79.sh fuzz FIRST COUNT REV | case KIND SEED VARY... [-- FIRST COUNT REV]" >&2
    exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
