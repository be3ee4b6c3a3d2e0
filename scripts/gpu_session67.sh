#!/usr/bin/env bash
# The GPU calls of session 67 (H200). Main left the compressed forward's scoring pass (pass 2, the block
# masses) in Triton only; this session wrote it in Gluon (nsa/ops/compressed/gluon_scores.py,
# NSA_GLUON_COMPRESSED_SCORES, off), compiled offline, never run:
#
#   bash scripts/gpu_session67.sh scores      # its GPU tests and the timing GPU tests (host share);
#                                             # NSA_GLUON_COMPRESSED_SCORES off and on at 64k and 32k
#                                             # (ABBA forward and forward+backward, kernel lists)
#
# All 8 tests passed; the kernel took 7.14-7.18 ms at 64k against the Triton pass 2's 5.47-5.53 (all
# 8 launches), 2.01 against 1.40-1.42 at 32k. Two versions followed, each run as this step (its
# tests, then the probe): the query rows copied through registers in a column order that keeps most
# of a position's heads in one thread (5.67 ms against 5.50-5.60; 1.66 against 1.40-1.45 at 32k),
# then tiles in pairs with the stores in a branch, so that ptxas keeps the next tile's product in
# flight during the masses (5.47-5.57 against 5.57-5.58; 1.64 against 1.40-1.45). Where its time goes:
#
#   bash scripts/gpu_session67.sh diagnose    # scripts/gpu_scores_probe.py: the kernel's launches with
#                                             # one part of its work taken away at a time
#
# At 64k, the Triton pass 2 5.35 ms, the kernel 5.47; without the exponentials 4.56, with one plane of
# masses 5.04, unmasked 5.23, 2 ring slots 5.20, 3 slots 5.33. Walks cut to one or two key tiles a
# program (the probe again with those forms): 1.30 and 1.53 ms at 64k, 0.645 and 0.756 at 32k (main
# 5.33-5.39 and 1.61-1.65): about 4 us a program beside its walk, a fifth of the kernel at 64k and a
# third at 32k. The kernel made persistent (a program an SM walks query tiles one after another, its
# key ring running on, each warpgroup's query rows and lse for the next tile gathered by cp.async
# while it walks this one; 2 ring slots):
#
#   bash scripts/gpu_session67.sh persistent  # its GPU tests; NSA_GLUON_COMPRESSED_SCORES off and on at
#                                             # 64k and 32k; the probe's forms main, one_tile, two_tiles
#
# All 8 tests passed. The kernel 4.84 ms at 64k against the Triton pass 2's 5.51-5.58 (1.14x), 1.264
# against 1.39-1.45 at 32k; the forward 31.10-31.21 against 31.37-31.80 at 64k, 12.16-12.18 against
# 12.26-12.27 at 32k; forward+backward 85.81-86.16 against 85.84-86.68 (ABBA). One or two key tiles a
# program: 0.76-0.83 and 0.84 ms at 64k (1.30 and 1.53 before). NSA_GLUON_COMPRESSED_SCORES on by
# default:
#
#   bash scripts/gpu_session67.sh tables      # the GPU tests of the ops, the layer and varlen with the
#                                             # library's defaults (each test's outcome on its own line);
#                                             # nsa-bench prefill (8k-64k)
#
# The tests ran past their 440 s at 92 %: 421 passed, 18 skipped, none failed. At b65257f: prefill 64k
# 30.75 / 117.5 ms (3.82x) forward, 86.11 / 446.6 (5.19x) forward+backward; 8k 0.91x and 1.21x. The 34
# tests the limit had cut, from a file of their ids (those of session 66's list not in this output):
#
#   bash scripts/gpu_session67.sh rest IDS    # the GPU tests listed in the file IDS
#
# 34 passed. Then the decode table:
#
#   bash scripts/gpu_session67.sh decode      # nsa-bench decode (batch 1-64)
#
# At 64k 19.07 / 49.57 us (2.60x) at batch 1, 70.99 / 493.2 (6.95x) at batch 16, 8.19x at batch 64.
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
persistent)
    run_group scores 200 2 tests/ops/test_gluon_scores.py
    probe_run 240 gluon_scores --lengths 65536 32768 --only gluon_scores
    timeout 200 python scripts/gpu_scores_probe.py --lengths 65536 32768 --forms main one_tile two_tiles 2>&1 \
        | tee "$OUT/scores_probe_persistent_h200.txt" | grep "^T="
    ;;
tables)
    verbose_tests 440 "$(git rev-parse --short HEAD 2>/dev/null || echo session67)" suite tests/ops \
        tests/test_module.py tests/test_varlen.py
    tar_reports
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    ;;
rest)
    timeout 230 python -m pytest -v -p no:cacheprovider -n 8 --dist worksteal -m "not benchmark" --gpu-profile auto \
        -rfEs --tb=short $(cat "${2:?rest needs the file of test ids}") > "$OUT/tests_rest.txt" 2>&1
    echo "== tests: rc $? after $(( $(date +%s) - start )) s"
    tail -2 "$OUT/tests_rest.txt"
    ;;
decode)
    decode_table h200
    ;;
diagnose)
    # run on the pairs form (4 ring slots; one_tile failed to compile, its walk a constant), then
    # again with one_tile fixed (--forms main one_tile two_tiles stages2; the stages forms are gone
    # since main took 2 slots)
    timeout 300 python scripts/gpu_scores_probe.py --lengths 65536 32768 "${@:2}" 2>&1 | tee "$OUT/scores_probe_h200.txt"
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
