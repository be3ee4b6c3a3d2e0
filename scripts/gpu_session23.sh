#!/bin/bash
# The GPU calls of session 23 (docs/perf/decode.md, "Session 23"):
#
#   bash scripts/gpu_session23.sh floor   # synthetic batch-1 decode steps that move the step's
#                                         # bytes with its dependencies and no attention math,
#                                         # beside the library's step and dense SDPA (64k, 8k)
#   bash scripts/gpu_session23.sh l2bytes # Nsight Compute: each kernel of one prefill forward
#                                         # (8k, 64k), NSA and dense SDPA (cuDNN): time, L2 and
#                                         # DRAM bytes, L2 and SM throughput against peak
#   bash scripts/gpu_session23.sh window  # the window forward's tiles (with the forced blocks, as
#                                         # the NSA ops launch it) at 8k and 64k
#   bash scripts/gpu_session23.sh cmpfwd  # the compressed forward with selection in tiles of 8
#                                         # query positions (128 rows) against 4 (8k, 16k, 64k)
#   bash scripts/gpu_session23.sh pdl     # batch-1 decode with programmatic dependent launch per
#                                         # launch (score, selected, combine): the GPU test, then
#                                         # correctness and graph timings of every combination
#   bash scripts/gpu_session23.sh beside  # the inference forward with the window kernel on a
#                                         # second stream beside the compressed pass (8k-64k)
#   bash scripts/gpu_session23.sh tests REV  # the decode GPU tests (kernels, graph, cache,
#                                         # module), the report named after REV
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: scripts/gpu_session23.sh floor|l2bytes|window|cmpfwd|pdl|beside|tests [REV]}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
case "$step" in
floor)
    for S in 65536 8192; do
        timeout 280 python scripts/gpu_decode_floor.py --context "$S" 2>&1 | tee "$OUT/decode_floor_$S.txt"
    done
    ;;
l2bytes)
    M=gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum
    M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
    for T in 8192 65536; do
        for who in nsa dense; do
            impl=$([ $who = dense ] && echo dense_cudnn || echo nsa)
            timeout 280 ncu --profile-from-start off --clock-control none --metrics "$M" --csv --page raw \
                python scripts/ncu_prefill.py --length $T --impl $impl > "$OUT/l2bytes_${who}_$T.csv" 2> "$OUT/l2bytes_${who}_$T.err"
            tail -3 "$OUT/l2bytes_${who}_$T.err"
        done
    done
    python scripts/ncu_bytes.py "$OUT"/l2bytes_*.csv | tee "$OUT/l2bytes.md"
    ;;
window)
    python scripts/gpu_prefill_probe.py --only window --lengths 8192 65536 2>&1 | tee "$OUT/window_tiles.txt"
    ;;
cmpfwd)
    python scripts/gpu_prefill_probe.py --only cmp_fwd --lengths 8192 16384 65536 2>&1 | tee "$OUT/cmp_fwd_rows.txt"
    ;;
pdl)
    python -m pytest -q -p no:cacheprovider tests/ops/test_decode_kernel.py -k pdl --gpu-profile auto 2>&1 | tail -4 \
        | tee "$OUT/pdl_tests.txt"
    python scripts/gpu_decode.py --contexts 8192 65536 --batches 1 --variants 8192 65536 --check-variants \
        --out "$OUT/decode_pdl.md" 2>&1 | tail -60
    ;;
beside)
    python scripts/gpu_prefill_probe.py --only win_beside --lengths 8192 16384 65536 2>&1 | tee "$OUT/win_beside.txt"
    ;;
tests)
    decode_gpu_tests "${2:-}"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
