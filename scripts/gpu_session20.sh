#!/bin/bash
# The GPU calls of session 20 (docs/perf/prefill.md and decode.md, "Session 20"):
#
#   bash scripts/gpu_session20.sh probe    # decode: each kernel's place in a graph replay (B = 1, 16;
#                                          # 8k, 64k); prefill: the compressed forward by tiles,
#                                          # register cap and score buffer (probe section cmp_fwd);
#                                          # every kernel of one 64k forward+backward
#   bash scripts/gpu_session20.sh sweep    # the compressed forward's tiles at 16k and 32k; the
#                                          # batch-1 64k decode step by compressed splits, warps, stages
#   bash scripts/gpu_session20.sh ab       # the compressed forward by tiles (first form: with its
#                                          # top-n fused or not); the whole prefill, 8k and 16k,
#                                          # against the session's start
#   bash scripts/gpu_session20.sh tests <rev>  # the compressed, selection and whole-op kernel tests
#                                          # alone (gpu_session15.sh's tests step)
#   bash scripts/gpu_session20.sh final <rev>  # the table (PROFILE=h100 or h200), then the
#                                          # compressed, selection and whole-op kernel tests
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
case "${1:?usage: scripts/gpu_session20.sh probe|sweep|ab|tests REV|final REV}" in
probe)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_decode_timeline.py 2>&1 | tee "$OUT/decode_timeline.txt"
    python scripts/gpu_prefill_probe.py --only cmp_fwd --lengths 8192 65536 2>&1 | tee "$OUT/cmp_fwd.txt"
    python scripts/gpu_prefill_probe.py --only kernels --kernels 24 --lengths 65536 2>&1 | tee "$OUT/kernels.txt"
    ;;
sweep)
    # the compressed forward's tiles at the lengths between; batch-1 decode by compressed splits
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_prefill_probe.py --only cmp_fwd --lengths 16384 32768 2>&1 | tee "$OUT/cmp_fwd_mid.txt"
    python scripts/gpu_decode_timeline.py --batches 1 --contexts 65536 --variants '{}' '{"splits": [32, 4, 1]}' \
        '{"splits": [64, 4, 1]}' '{"cmp_warps": 8}' '{"cmp_stages": 4}' '{"splits": [32, 4, 1], "cmp_stages": 1}' \
        2>&1 | tee "$OUT/decode_timeline_splits.txt"
    ;;
ab)
    # the compressed forward by tiles (and, in the session's first form of this step, with its
    # top-n fused), then the whole prefill against the session's start (ab_base/, extracted by:
    # git archive 4d6a2d8 src | tar -x -C ab_base; the device tool's call carries it)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_prefill_probe.py --only cmp_fwd --lengths ${PROBE_LENGTHS:-8192 16384 32768 65536} 2>&1 \
        | tee "$OUT/cmp_fwd_topn.txt"
    bash scripts/gpu_ab_prefill.sh ab_base "${LENGTHS:-8192,16384}" 2 2>&1 \
        | grep -v "^batch\|^    1 \|^routes" | tee "$OUT/ab.txt"
    ;;
tests | final)
    TESTS="${TESTS:-tests/ops/test_compressed_kernel.py tests/ops/test_select_kernel.py tests/ops/test_nsa_attention_kernel.py}" \
        exec bash scripts/gpu_session15.sh "$@"
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
