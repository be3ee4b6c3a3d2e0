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
#
# At 61e9878: prefill 64k 30.13 / 115.9 ms (3.85x) forward, 84.66 / 440.9 (5.21x) forward+backward; 8k
# 2.105 / 1.833 (0.87x) and 6.082 / 7.411 (1.22x). The tests: 69 passed, 4 skipped (interpreter sizes);
# no kernel's wgmma serialised. The decode table (no decode kernel changed):
#
#   bash scripts/gpu_session69.sh decode      # nsa-bench decode (batch 1-64)
#
# At 61e9878: batch 1 at 64k 18.96 / 49.82 us (2.63x), batch 16 71.04 / 493.6 (6.95x). The window
# forward in Gluon (nsa/ops/window/gluon_fwd.py) issues a step's P V after its softmax and waits for it
# at once: no product of a warpgroup runs beside the next softmax. In src/ for the call: the window's
# steps (after the forced blocks') issue the previous tile's P V and the next tile's scores, then run
# this tile's softmax beside both (a shared-memory store keeping ptxas's wait for P V after it). Main's
# kernel exported to .variants69/before_fwd.py:
#
#   bash scripts/gpu_session69.sh window      # the window forward's GPU tests; main's kernel (before)
#                                             # against this one at 64k and 8k
#
# The 11 tests passed; bitwise main's results. The kernel 4.07-4.09 ms at 64k against main's 4.07-4.13,
# 0.479-0.481 against 0.464-0.468 at 8k: no faster. Dropped (docs/perf/attempts/
# prefill_window_fwd_overlapped.patch); main's kernel restored.
#
# The two computing warpgroups of these kernels read one ring of key tiles, each slot released by both,
# so they run in step: their softmaxes fall together, as do their products. FlashAttention-3 makes them
# take turns (ping-pong): a warpgroup issues a step's products only after the other has issued its own,
# so that one's softmax runs beside the other's products. Two mbarriers in shared memory pass the turn.
# Variants (.variants69/): pass 1 taking turns (pingpong_pass1.py, this tree's pass 1 otherwise), the
# overlapped window forward above (overlapped_fwd.py) and the same taking turns (pingpong_fwd.py):
#
#   bash scripts/gpu_session69.sh turns       # each against this tree's kernel: pass 1 at 64k, the
#                                             # window forward at 64k and 8k
#
# All bitwise this tree's results, none faster. Pass 1 taking turns 8.08-8.13 ms against 7.90-7.91 (this
# machine). The window forward taking turns 4.26-4.30 ms at 64k against 4.00-4.07 (overlapped 4.07-4.09),
# 0.493-0.496 at 8k against 0.466-0.467 (overlapped 0.472-0.474). Dropped (docs/perf/attempts/
# prefill_pass1_turns.patch, prefill_window_fwd_turns.patch).
#
# Pass 1 launched a program a query tile (32768 at 64k, one at a time an SM): each one's copies of its
# query rows and first key tiles start only when it does. In src/ for the call: pass 1 persistent, as the
# window forward is (a program an SM walks the query tiles, the key ring runs on from one to the next, a
# warpgroup's next query rows load once it has issued its last scores). This tree's kernel exported to
# .variants69/programs_pass1.py:
#
#   bash scripts/gpu_session69.sh persistent  # pass 1's GPU tests; the program-a-tile kernel (programs)
#                                             # against this one at 64k and 32k
#
# The 7 tests passed; bitwise the same. Pass 1 persistent 7.46-7.47 ms at 64k against 8.15-8.30 (1.10x),
# 2.04-2.10 at 32k against 2.31-2.34; the forward 29.94-30.41 ms against 30.60-30.74 at 64k, 11.67-11.80
# against 11.94-11.99 at 32k. Kept. The prefill table with it and the GPU tests again:
#
#   bash scripts/gpu_session69.sh final       # as above
#
# At b823b18: prefill 64k 30.16 / 117.4 ms (3.89x) forward, 85.63 / 449.0 (5.24x) forward+backward; 8k
# 2.122 / 1.932 (0.91x) and 6.203 / 7.554 (1.22x). The tests: 69 passed, 4 skipped; no wgmma serialised.
# Where no query sees more than 1024 compressed tokens (16k and shorter) the compressed forward runs as
# one fused Triton launch; session 68 found its passes apart (both Gluon kernels) slower at 8k and the
# same at 16k. Pass 1 is now faster, so again:
#
#   bash scripts/gpu_session69.sh short       # the probe's short_apart at 8k and 16k
#
# 8k: apart still slower (pass 1 0.231-0.233 ms and the scoring pass 0.127 against the fused launch's
# 0.337-0.341; the forward 2.179-2.213 against 2.138-2.194). 16k: apart now faster (0.625 + 0.387
# against 1.120-1.184; the forward 4.984-5.042 against 5.065-5.143, forward+backward 14.21-14.38
# against 14.15-14.47); selections equal but for 0.002-0.003 % of (query, head) rows (near-ties). Not
# changed this session: SHORT_TOKENS also picks the Triton launch's short tiles where the Gluon kernels
# do not run (other GPUs), and the device time was spent.
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
    prefill_table_and_tests
    ;;
decode)
    decode_table h200
    ;;
window)
    run_group window_fwd 150 4 tests/ops/test_gluon_window_fwd.py
    probe_run 300 window_fwd_variants --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch window \
        --variant-module gluon_fwd --dkdv-variant before=.variants69/before_fwd.py
    ;;
turns)
    probe_run 150 pass1_turns --lengths 65536 --only gluon_dkdv_variants --variant-module gluon_pass1 \
        --dkdv-variant pingpong=.variants69/pingpong_pass1.py
    probe_run 330 window_fwd_turns --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch window \
        --variant-module gluon_fwd --dkdv-variant overlapped=.variants69/overlapped_fwd.py \
        --dkdv-variant pingpong=.variants69/pingpong_fwd.py
    ;;
persistent)
    run_group pass1 150 4 tests/ops/test_gluon_pass1.py
    probe_run 300 pass1_persistent --lengths 65536 32768 --only gluon_dkdv_variants --variant-module gluon_pass1 \
        --dkdv-variant programs=.variants69/programs_pass1.py
    ;;
short)
    probe_run 200 short_apart --lengths 8192 16384 --only short_apart
    ;;
*)
    echo "unknown step $step"
    exit 2
    ;;
esac
