#!/bin/bash
# The GPU calls of session 25 (docs/perf/decode.md, "Session 25"):
#
#   bash scripts/gpu_session25.sh scoretopk # decode: each score tile's candidates by one bitonic
#                                           # top-k (score_topk) against the all-pairs rank, tiles of
#                                           # 32-256 blocks: the CPU-sized GPU tests, then correctness
#                                           # and graph timings of every variant (8k, 64k; batch 1, 16).
#                                           # Dropped: run it on a tree with
#                                           # docs/perf/attempts/decode_score_tile_topk.patch
#   bash scripts/gpu_session25.sh gather REV # decode: the score programs take each block's token
#                                           # before it from their tile's range (tl.gather) against
#                                           # reading it again: correctness and graph timings in turn
#                                           # (8k-64k; batch 1, 16), then the decode GPU tests, the
#                                           # report named after REV. Dropped: run it on a tree with
#                                           # docs/perf/attempts/decode_score_gather_tile_tokens.patch
#   bash scripts/gpu_session25.sh workers   # the GPU suite's time against its xdist workers: two files
#                                           # whose tests compile many small kernels, on 3 and on 12
#                                           # workers, each from an empty Triton cache
#   bash scripts/gpu_session25.sh suite REV # the whole suite but the benchmarks on 12 workers, from an
#                                           # empty Triton cache, the report named after REV
#   bash scripts/gpu_session25.sh dtypes    # the kernels each op compiles for bfloat16 and float32 inputs
#                                           # (head dims 128 and 192/128), compile and call times,
#                                           # registers and spills, from an empty Triton cache
#                                           # (TESTS, DTYPES, DIMS, OPS, LIMIT: see the step)
#   bash scripts/gpu_session25.sh ncu       # where one batch-1 step at 64k spends its kernels' time:
#                                           # Nsight Compute's warp states and stall sampling of the
#                                           # four decode kernels (PDL off)
#   bash scripts/gpu_session25.sh h200      # on an H200 only (exits 3 elsewhere): the decode table
#                                           # (nsa-bench), the batch-1 floors at 64k, the 8-layer graph
#   bash scripts/gpu_session25.sh h200p     # on an H200 only: the prefill table (nsa-bench, 8k-64k)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: scripts/gpu_session25.sh scoretopk|gather REV|workers|suite REV|dtypes|ncu|h200|h200p}"
device_line
case "$step" in
scoretopk)
    python -m pytest -q -p no:cacheprovider tests/ops/test_decode_kernel.py -k "score-topk" --gpu-profile auto 2>&1 | tail -3 \
        | tee "$OUT/score_topk_tests.txt"
    timeout 420 python scripts/gpu_decode.py --contexts 8192 65536 --variants 8192 65536 --check-variants \
        --out "$OUT/decode_score_topk.md" 2>&1 | tail -70
    ;;
gather)
    timeout 400 python scripts/gpu_decode.py --contexts 8192 16384 32768 65536 --check-contexts 8192 65536 \
        --variants 8192 16384 32768 65536 --check-variants --out "$OUT/decode_score_gather.md" 2>&1 | grep -v "^- decode_" | tail -60
    decode_gpu_tests "${2:?the commit to name the report after}"
    ;;
workers)
    for n in 3 12; do
        export TRITON_CACHE_DIR="/tmp/triton_cache_n$n"
        rm -rf "$TRITON_CACHE_DIR"
        start=$(date +%s)
        python -m pytest -q -p no:cacheprovider -n "$n" --dist worksteal -m "not benchmark" --gpu-profile auto \
            tests/ops/test_window_kernel.py tests/test_identities.py 2>&1 | tail -1
        echo "workers $n: $(( $(date +%s) - start )) s" | tee -a "$OUT/workers.txt"
    done
    ;;
suite)
    export TRITON_CACHE_DIR=/tmp/triton_cache_suite
    rm -rf "$TRITON_CACHE_DIR"
    start=$(date +%s)
    timeout 560 python -m pytest -q -n 12 --dist worksteal -m "not benchmark" --gpu-profile auto --nsa-report "$OUT" \
        --nsa-report-commit "${2:?suite needs the commit to name the report after}" 2>&1 | tail -8
    echo "suite on 12 workers: $(( $(date +%s) - start )) s" | tee "$OUT/suite_time.txt"
    ;;
dtypes)
    export TRITON_CACHE_DIR=/tmp/triton_cache_dtypes
    rm -rf "$TRITON_CACHE_DIR"
    # TESTS: GPU tests to run first; DTYPES, DIMS: the dtypes and Dk:Dv pairs (default: bfloat16
    # and float32; 128:128 and 192:128); OPS: only these ops; LIMIT: seconds for the listing (default 560)
    # shellcheck disable=SC2086  # lists
    [ -n "${TESTS:-}" ] && python -m pytest -q -p no:cacheprovider --durations=3 --gpu-profile auto $TESTS 2>&1 | tail -8
    timeout "${LIMIT:-560}" python scripts/gpu_kernels_by_dtype.py --dtypes ${DTYPES:-bfloat16 float32} \
        --dims ${DIMS:-128:128 192:128} ${OPS:+--ops $OPS} 2>&1 | tee "$OUT/kernels_by_dtype.md"
    ;;
ncu)
    timeout 300 ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \
        --section SourceCounters --section LaunchStats -k regex:decode_ \
        python scripts/ncu_decode.py --cases 1:65536 > "$OUT/ncu_decode_b1_64k.txt" 2> "$OUT/ncu_decode_b1_64k.err"
    grep -E "decode_|Duration|Stall|stall|Warp Cycles|Issued|Elapsed|Memory Throughput|DRAM Through|Registers|Block Size|Grid Size" \
        "$OUT/ncu_decode_b1_64k.txt" | head -120
    ;;
h200)
    h200_decode || exit
    ;;
h200p)
    h200_prefill || exit
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
