#!/usr/bin/env bash
# The GPU calls of session 72 (H200). The selected forward in Gluon (nsa/ops/selected/gluon_fwd.py,
# NSA_GLUON_SELECTED_FWD): neighbouring queries of a KV head (8 a program) share each block's copy (a
# copy partition loads the union of their lists into a ring of slots by TMA; one-warp partitions
# compute, a query each, by mma.sync over the blocks of their own list only), where the Triton forward
# takes one query a program. Measured and dropped: every step needs
# docs/perf/attempts/prefill_selected_union_gluon.patch applied (the module, its launch, flag, tests
# and scripts/gpu_selected_fwd_probe.py).
#
#   bash scripts/gpu_session72.sh first       # the kernel's GPU tests against the Triton forward; the
#                                             # probe's gluon_selected_fwd (flag off and on: forward and
#                                             # forward+backward in ABBA rounds, the forward's kernels)
#                                             # at 8k, 16k and 64k
#
# Run twice. With the union in the order of its first entries (4 slots): the kernel 4.06 ms at 8k
# against the Triton forward's 1.25, 26.4 against 12.3 at 64k; the 8k forward 5.04-5.07 against
# 2.12-2.15 ms. With the union sorted by block (6 slots): 4.27 and 38.7 ms. The kernel's GPU tests: 8
# passed (the second run; the first failed 3 on its tests' own errors, since fixed).
#
#   bash scripts/gpu_session72.sh forms       # the kernel alone in forms that take one part of its
#                                             # work away (scripts/gpu_selected_fwd_probe.py)
#
# Run four times (the shapes as the session went). 8 queries a program, 8k / 64k ms: the whole kernel
# 3.39 / 31.6, its copies alone 0.65 / 10.5, its computing warps alone 2.26 / 19.5; the Triton forward
# 1.20 / 11.8. 4 queries, two programs an SM (3 slots, 128 registers): 1.56-1.58 / 13.8-14.0, copies
# 0.81 / 11.0, computing 1.15 / 10.4. The computing partition noinline (one copy of its code for the 8
# warps) ran into an illegal instruction (a CTA-wide barrier in the function).
#
#   bash scripts/gpu_session72.sh triton      # the Triton forward's warps, stages and block loads swept
#
# 1 warp, 2 stages, bulk copies (the default) 1.206 / 11.76 ms; 1 stage 1.238 / 11.95; 3 stages 1.41 /
# 12.23; plain loads 1.26-2.57 / 12.1-21.7; 2 warps 1.42 / 12.4-12.6. The defaults hold.
#
#   bash scripts/gpu_session72.sh ncu         # Nsight Compute's launch, occupancy, scheduler and warp
#                                             # state sections of the Gluon kernel's compute alone (4
#                                             # and 8 queries a program) and of the Triton forward, 8k
#
# 8 queries: 0.49 instructions a cycle an SM, 53 % of the warps' cycles waiting for an instruction
# fetch (8 copies of the loop's code, two a scheduler). 4 queries, two programs an SM: 0.93, 16 warps
# resident. The Triton forward: 0.99, 6 warps an SM (shared memory allows 6 programs), 254 registers.
#
#   bash scripts/gpu_session72.sh wgmma       # the transposed form (a warpgroup a query, S^T = K Q^T
#                                             # by wgmma) against 4:3:128, the forms of both
#
# Correct (o within 1.1e-5 of the Triton forward's, lse 9.5e-7), slower: 1.70 / 15.7 ms, its compute
# alone 1.57 / 14.1 (267 instructions a warp a block, four warps a query, 10 warpgroup barriers).
# The counts of shared blocks the kernel rests on: scripts/selection_overlap.py (CPU).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
first)
    run_group gluon 200 1 tests/ops/test_gluon_selected_fwd.py
    probe_run 360 gluon_selected_fwd --only gluon_selected_fwd --lengths 8192 16384 65536
    ;;
forms)
    timeout 300 python scripts/gpu_selected_fwd_probe.py --lengths 8192 65536 --shapes 4:3:128 8:6:168 \
        --forms main "no compute" "no copies" 2>&1 | tee "$OUT/forms.txt"
    ;;
triton)
    timeout 300 python scripts/gpu_selected_fwd_probe.py --lengths 8192 65536 --shapes 4:3:128 --forms main \
        --triton-tiles 1:1:copies 1:2:copies 1:3:copies 1:1:loads 1:2:loads 1:3:loads 2:1:copies 2:2:copies \
        2>&1 | tee "$OUT/triton.txt"
    ;;
ncu)
    sections=(--section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats
              --section ComputeWorkloadAnalysis --section InstructionStats)
    for shape in 4:3:128 8:6:168; do
        timeout 150 ncu -k regex:selected_fwd_gluon_kernel -c 1 "${sections[@]}" --csv \
            python scripts/gpu_selected_fwd_probe.py --lengths 8192 --shapes "$shape" --forms "no copies" \
            > "$OUT/ncu_gluon_${shape//:/_}.csv" 2> "$OUT/ncu_gluon_${shape//:/_}.log"
        echo "== ncu $shape: rc $? after $(( $(date +%s) - start )) s"
    done
    timeout 150 ncu -k regex:selected_fwd_kernel -c 1 "${sections[@]}" --csv \
        python scripts/gpu_selected_fwd_probe.py --lengths 8192 --shapes 4:3:128 --forms main \
        > "$OUT/ncu_triton.csv" 2> "$OUT/ncu_triton.log"
    echo "== ncu triton: rc $? after $(( $(date +%s) - start )) s"
    ;;
wgmma)
    timeout 300 python scripts/gpu_selected_fwd_probe.py --lengths 8192 65536 --shapes w4:6:96 4:3:128 \
        --forms main "no compute" "no copies" 2>&1 | tee "$OUT/wgmma.txt"
    ;;
*)
    echo "usage: bash scripts/gpu_session72.sh first|forms|triton|ncu|wgmma" >&2
    exit 2
    ;;
esac
echo "elapsed $(( $(date +%s) - start )) s"
