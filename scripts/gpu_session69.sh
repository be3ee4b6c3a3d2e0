#!/usr/bin/env bash
# The GPU calls of session 69 (H200). The compressed forward's pass 1 in Gluon
# (nsa/ops/compressed/gluon_pass1.py) waited for a step's scores and its P V together before the step's
# softmax, so no product of a warpgroup ran beside its own exponentials. In src/ for the call: P V left
# to run beside the softmax (FlashAttention-3's order: the scores, the rescale while they run, P V, wait
# for the scores, softmax, wait for P V), with a store to shared memory before the last wait (ptxas hoists
# a wgmma wait to the top of its block, before the exponentials, but keeps it after a shared-memory
# store). Main's kernel and the same order with the rescale after the wait were exported to .variants69/
# (untracked, deleted after the calls):
#   git show 5285604:src/nsa/ops/compressed/gluon_pass1.py > .variants69/before_pass1.py
#
#   bash scripts/gpu_session69.sh pass1       # pass 1's GPU tests; main's kernel (before) and the
#                                             # other order (sink) against this one at 64k
#
# The 6 tests passed; all three bitwise the same (the same arithmetic). Pass 1 took 8.27-8.41 ms in this
# order, 8.58-8.61 before (sink 8.27-8.57); the forward 30.62-31.09 ms against 31.03-31.25 in the ABBA
# rounds. Kept. The prefill table with it, the GPU tests of pass 1, the NSA prefill and the wgmma
# serialisation check:
#
#   bash scripts/gpu_session69.sh final       # nsa-bench prefill (8k-64k); those GPU tests
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session69.sh STEP}"

device_line
case "$step" in
pass1)
    run_group pass1 150 4 tests/ops/test_gluon_pass1.py
    probe_run 330 pass1_variants --lengths 65536 --only gluon_dkdv_variants --variant-module gluon_pass1 \
        --dkdv-variant before=.variants69/before_pass1.py --dkdv-variant sink=.variants69/sink_pass1.py
    ;;
final)
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    run_group nsa 200 8 tests/ops/test_gluon_pass1.py tests/ops/test_nsa_attention_kernel.py \
        tests/ops/test_compressed_kernel.py
    run_group wgmma 150 1 tests/ops/test_wgmma_serialisation.py
    ;;
*)
    echo "unknown step $step"
    exit 2
    ;;
esac
