#!/usr/bin/env bash
# The GPU calls of session 68 (H200). The window forward in Gluon (nsa/ops/window/gluon_fwd.py) stepped
# through 128 keys a step instead of 64, in the order local blocks, window, initial blocks, the local
# blocks' accumulator kept in shared memory while the window's steps ran (2 ring slots: shared
# memory); compiled offline, never run. Main's kernel (64 keys a step) was exported to .variants68/
# (untracked, deleted after the calls), as were the variants of the later steps:
#   git show e35570e:src/nsa/ops/window/gluon_fwd.py > .variants68/keys64_fwd.py
#
#   bash scripts/gpu_session68.sh probe       # the Gluon window forward's GPU tests; the kernel against
#                                             # main's (gradients, ABBA forward and forward+backward,
#                                             # kernel lists) at 64k and 8k; the compressed forward's
#                                             # short walks (8k, 16k) fused or in the passes apart
#
# The 9 tests passed; the kernel 6.85-6.91 ms at 64k against main's 4.53-4.54, 0.77-0.80 against 0.50
# at 8k. The short walks apart: 8k forward 2.49-2.50 against 2.40-2.44 ms, 16k the same within noise.
# The 128-key steps with a key and a value ring of their own (a key slot refills once its scores are
# done), and the same tree at 64 keys and 4 slots (.variants68/split64_fwd.py):
#
#   bash scripts/gpu_session68.sh split       # the tests; main's kernel (keys64) and the 64-key form
#                                             # (split64) against this one
#
# The 9 tests passed; 128 keys 5.79-5.86 ms at 64k, split64 5.54, main's 4.49-4.58 (0.65, 0.60 and 0.50
# at 8k). Nsight Compute on main's kernel at 8k (restored in src/), and two variants of it: the 64-key
# form with the local state kept in swizzled shared memory and one ring (.variants68/stash_fwd.py), and
# main's with 6 ring slots (.variants68/stages6_fwd.py):
#
#   bash scripts/gpu_session68.sh ncu         # ncu --set full (details, SASS source page with stall
#                                             # samples); the variants against main's
#
# Tensor pipe 33.9 % busy, issue slots 39.2 %, 0.56 eligible warps a scheduler. stash 5.18-5.23 ms at
# 64k, stages6 4.62-4.64, main's 4.56-4.69 (0.571-0.578, 0.508-0.509, 0.504-0.520 at 8k). The rows of
# the next item in a second slot of their own (in src/), against main's and the same with 5 ring slots
# (.variants68/qbuf2_stages5_fwd.py):
#
#   bash scripts/gpu_session68.sh qbuf        # the tests; the variants against this one
#
# The 9 tests passed; all three bitwise the same and within noise: 4.58-4.62 ms at 64k (main's
# 4.60-4.61, 5 slots 4.58-4.61), 0.505-0.527 at 8k. Main's kernel restored; no kernel changed this
# session. The tables at the session's last commit:
#
#   bash scripts/gpu_session68.sh tables      # nsa-bench prefill (8k-64k) and decode (batch 1-64)
#
# At 3313cbc: prefill 64k 31.12 / 120.0 ms (3.86x) forward, 87.35 / 451.2 (5.17x) forward+backward; 8k
# 0.93x and 1.21x. Decode at 64k 19.14 / 49.62 us (2.59x) at batch 1, 71.52 / 492.8 (6.89x) at batch 16.
# Nsight Compute's source page had shown the steps' loop issuing about 536 instructions a step, about
# 100 of them selects: the switches between the forced blocks' and the window's states compiled into
# selects of the whole accumulator at every step, and every tile masked. The steps in phases, each a
# loop of its own (local blocks, initial blocks, the window's edge tiles masked, its inner tiles not):
#
#   bash scripts/gpu_session68.sh phases      # the tests; main's kernel (keys64) against this one
#
# The 9 tests passed; bitwise main's results; the kernel 4.28-4.30 ms at 64k against main's 4.63-4.68
# (1.08x), 0.467-0.471 against 0.503-0.505 at 8k. Kept. The prefill table with it, and the GPU tests of
# the NSA prefill, the window kernels and varlen:
#
#   bash scripts/gpu_session68.sh final       # nsa-bench prefill (8k-64k); those GPU tests
#
# At 21e269d: prefill 64k 31.60 / 120.6 ms (3.82x) forward, 87.47 / 457.0 (5.22x) forward+backward; 8k
# 2.110 / 1.783 (0.85x) and 1.22x. The tests: 99 passed, 4 skipped (interpreter sizes). A GPU test of
# the NSA prefill with windows of 192 and 1000 keys (the edge between masked and unmasked tiles):
#
#   bash scripts/gpu_session68.sh windows     # the Gluon window forward's GPU tests
#
# 11 passed; a mutant with no edge tiles failed the new test and the four NSA cases (6 failed). The
# window dQ with its inner band tiles unmasked, each kind of step a branch of its own (branch
# next/window-dq-unmasked, in src/ for the call), against main's (.variants68/main_dq.py):
#
#   bash scripts/gpu_session68.sh dq          # the window dQ's GPU tests; main's kernel against it at 64k
#
# The 9 tests passed; gradients bitwise main's. Both sides printed as "main" (the variant's label
# repeated the section's own): in the ABBA order the branch's rows are the 1st, 4th, 5th and 8th
# (forward+backward 85.95-87.05 ms against 86.81-87.30) and its kernel lists the 1st and 3rd (the dQ
# 4.37-4.52 ms against 4.44-4.50): within noise, left on its branch.
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session68.sh STEP}"

# The Gluon window forward's GPU tests, then the probe's comparison of gluon_fwd.py files against this
# tree's at 64k and 8k: window_fwd_variants NAME LIMIT LABEL=FILE...
window_fwd_variants() {
    local name="$1" limit="$2" variant args=()
    shift 2
    for variant in "$@"; do args+=(--dkdv-variant "$variant"); done
    run_group window_fwd 150 2 tests/ops/test_gluon_window_fwd.py
    probe_run "$limit" "$name" --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch window \
        --variant-module gluon_fwd "${args[@]}"
}

device_line
case "$step" in
probe)
    window_fwd_variants window_fwd_keys 240 keys64=.variants68/keys64_fwd.py
    probe_run 150 short_apart --lengths 8192 16384 --only short_apart
    ;;
split)
    window_fwd_variants window_fwd_split 300 keys64=.variants68/keys64_fwd.py split64=.variants68/split64_fwd.py
    ;;
ncu)
    timeout 200 ncu --profile-from-start off --clock-control none -k regex:window_fwd_gluon_kernel --set full --import-source no \
        -o /tmp/window_fwd python scripts/ncu_prefill.py --length 8192 > "$OUT/ncu_run.txt" 2>&1
    echo "== ncu: rc $? after $(( $(date +%s) - start )) s"
    ncu -i /tmp/window_fwd.ncu-rep --page details > "$OUT/ncu_details_window_fwd.txt" 2>&1
    ncu -i /tmp/window_fwd.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_sass_window_fwd.csv" 2>&1
    echo "== ncu pages after $(( $(date +%s) - start )) s"
    probe_run 300 window_fwd_variants --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch window \
        --variant-module gluon_fwd --dkdv-variant stash=.variants68/stash_fwd.py \
        --dkdv-variant stages6=.variants68/stages6_fwd.py  # no tests: main's kernel, variants unmerged
    ;;
qbuf)
    window_fwd_variants window_fwd_qbuf 300 keys64=.variants68/keys64_fwd.py stages5=.variants68/qbuf2_stages5_fwd.py
    ;;
phases)
    window_fwd_variants window_fwd_phases 240 keys64=.variants68/keys64_fwd.py
    ;;
tables)
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
final)
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    run_group nsa 240 8 tests/ops/test_nsa_attention_kernel.py tests/ops/test_window_kernel.py tests/ops/test_gluon_window_fwd.py \
        tests/test_varlen.py
    ;;
windows)
    run_group windows 150 4 tests/ops/test_gluon_window_fwd.py
    # a mutant whose edge tiles go unmasked (no edge tile): the new test must fail on it
    rm -rf /tmp/mutant && cp -r src /tmp/mutant
    sed -i 's/        n_edge = gl.minimum(gl.maximum(gl.cdiv(t_hi - W + 1 - first, BN), 0), n_win)/        n_edge = 0 * n_win/' \
        /tmp/mutant/nsa/ops/window/gluon_fwd.py
    grep -c "n_edge = 0 \* n_win" /tmp/mutant/nsa/ops/window/gluon_fwd.py
    PYTHONPATH=/tmp/mutant:$PWD/scripts timeout 120 python -m pytest -q -p no:cacheprovider -n 2 --gpu-profile auto \
        tests/ops/test_gluon_window_fwd.py -k "other_windows or in_nsa" > "$OUT/windows_mutant.txt" 2>&1
    echo "== mutant: rc $? after $(( $(date +%s) - start )) s"
    grep -E "passed|failed" "$OUT/windows_mutant.txt" | tail -3
    ;;
dq)
    run_group window_dq 110 4 tests/ops/test_gluon_window_dq.py
    probe_run 150 window_dq_unmasked --lengths 65536 --only gluon_dkdv_variants --dkdv-branch window \
        --variant-module gluon_dq --dkdv-variant main=.variants68/main_dq.py
    ;;
*)
    echo "unknown step $step"
    exit 2
    ;;
esac
