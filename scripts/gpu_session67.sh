#!/usr/bin/env bash
# The GPU calls of session 67 (H200). Main left the compressed forward's scoring pass (pass 2, the block
# masses) in Triton only; this session wrote it in Gluon (nsa/ops/compressed/gluon_scores.py,
# NSA_GLUON_COMPRESSED_SCORES, off), compiled offline, never run:
#
#   bash scripts/gpu_session67.sh scores      # its GPU tests and the timing GPU tests (host share);
#                                             # NSA_GLUON_COMPRESSED_SCORES off and on at 64k and 32k
#                                             # (ABBA forward and forward+backward, kernel lists)
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session67.sh STEP}"

device_line
case "$step" in
scores)
    run_group scores 200 2 tests/ops/test_gluon_scores.py
    timeout 120 python -m pytest tests/bench -p no:cacheprovider --gpu-profile auto -q -rs > "$OUT/timing_tests.txt" 2>&1
    echo "== timing tests: rc $? after $(( $(date +%s) - start )) s"
    tail -4 "$OUT/timing_tests.txt"
    probe_run 240 gluon_scores --lengths 65536 32768 --only gluon_scores
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
