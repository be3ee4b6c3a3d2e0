#!/usr/bin/env bash
# The GPU calls of session 74 (H200). The prefill top-n ranks each (query, KV group) row of block
# masses by a radix select whose rounds compare every key of the row (1.6 ms of the 64k forward,
# 8 launches). Only the keys from the select's lower bound up can be chosen; the kernel now gathers
# them where a row holds at most 128 (nsa.ops._triton.block_topn, LAUNCH["candidates"]) and ranks
# them alone.
#
#   bash scripts/gpu_session74.sh topn        # the selection GPU tests; then the probe's section
#                                             # topn_gather at 64k and 8k: how many keys the real rows
#                                             # gather, the blocks with each cap against whole rows,
#                                             # the default against whole rows (ABBA) and the kernel
#                                             # lists
#
#   bash scripts/gpu_session74.sh table       # the prefill table, then the GPU tests of pass 1, the NSA
#                                             # prefill, the compressed kernels and the wgmma check
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
topn)
    run_group select 150 4 tests/ops/test_select_kernel.py tests/ops/test_gluon_scores.py
    probe_run 420 topn_gather --only topn_gather --lengths 65536 8192
    ;;
table)
    prefill_table_and_tests
    ;;
*)
    echo "usage: bash scripts/gpu_session74.sh topn|table" >&2
    exit 2
    ;;
esac
echo "elapsed $(( $(date +%s) - start )) s"
