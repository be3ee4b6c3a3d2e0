#!/bin/bash
# The GPU calls of session 24 (docs/perf/decode.md, "Session 24"):
#
#   bash scripts/gpu_session24.sh layers   # one layer's decode step inside a graph of 8 layers
#                                          # (each its own caches, each query the last output),
#                                          # NSA and dense SDPA, 8k and 64k, batch 1 and 16
#   bash scripts/gpu_session24.sh pipe     # the window and selected forwards by query chunks,
#                                          # the window's on a second stream (8k, 16k, 64k)
#   bash scripts/gpu_session24.sh prefetch # decode: the score programs prefetch their tiles'
#                                          # best blocks into L2: the GPU test, then correctness
#                                          # and graph timings by count (8k, 64k; batch 1, 16).
#                                          # Dropped: run it on a tree with
#                                          # docs/perf/attempts/decode_l2_prefetch_best_blocks.patch
#   bash scripts/gpu_session24.sh scorebuf # the compressed forward with selection by score buffer
#                                          # size, hence query chunks (16k, 32k, 64k)
#   bash scripts/gpu_session24.sh h200     # on an H200 only (exits 3 elsewhere): the decode table
#                                          # (nsa-bench), the batch-1 floors at 64k, the 8-layer graph
#   bash scripts/gpu_session24.sh h200p    # on an H200 only: the prefill table (nsa-bench, 8k-64k)
#   bash scripts/gpu_session24.sh table    # the H100 prefill table again (nsa-bench, 8k-64k)
#   bash scripts/gpu_session24.sh ab REV   # the compressed dK/dV's split sum in one launch: the
#                                          # compressed and whole-op GPU tests (report named after
#                                          # REV; they ran past their 300 s), then the prefill A/B
#                                          # against ab_base (carried). Dropped: run it on a tree with
#                                          # docs/perf/attempts/prefill_compressed_dkdv_split_sum_kernel.patch
#   bash scripts/gpu_session24.sh tests REV # the interpreter speed-up's tests (on a GPU: installed,
#                                          # the interpreter ones skip), then the decode GPU tests,
#                                          # the report named after REV
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: scripts/gpu_session24.sh layers|pipe|prefetch|scorebuf|h200|h200p|table|ab REV|tests REV}"
device_line
case "$step" in
layers)
    timeout 500 python scripts/gpu_decode_layers.py 2>&1 | tee "$OUT/decode_layers.md"
    ;;
pipe)
    python scripts/gpu_prefill_probe.py --only win_slc_pipe --lengths 8192 16384 65536 2>&1 | tee "$OUT/win_slc_pipe.txt"
    ;;
prefetch)
    python -m pytest -q -p no:cacheprovider tests/ops/test_decode_kernel.py -k "prefetch" --gpu-profile auto 2>&1 | tail -4 \
        | tee "$OUT/prefetch_tests.txt"
    python scripts/gpu_decode.py --contexts 8192 65536 --variants 8192 65536 --check-variants \
        --out "$OUT/decode_prefetch.md" 2>&1 | tail -60
    ;;
scorebuf)
    python scripts/gpu_prefill_probe.py --only cmp_fwd --lengths 16384 32768 65536 2>&1 | tee "$OUT/cmp_fwd_score_buffer.txt"
    ;;
h200)
    h200_decode || exit
    ;;
h200p)
    h200_prefill || exit
    ;;
table)
    python -m nsa.bench prefill --profile h100 --budget 4 --csv "$OUT/prefill_h100.csv" --plot "$OUT/prefill_h100.png" 2>&1 | tail -8
    ;;
ab)
    gpu_tests "${2:?the commit to name the report after}" tests/ops/test_compressed_kernel.py \
        tests/ops/test_nsa_attention_kernel.py
    PYTHON=python bash scripts/gpu_ab_prefill.sh ab_base 8192,65536 2 2>&1 | tee "$OUT/ab_sum_splits.txt" | grep -v "^baseline"
    ;;
tests)
    python -m pytest -q -p no:cacheprovider tests/test_interpreter_speedup.py --gpu-profile auto 2>&1 | tail -4
    decode_gpu_tests "${2:?the commit to name the report after}"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
