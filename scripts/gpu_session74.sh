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
# Run with docs/perf/attempts/prefill_topn_gather.patch applied (the gather, dropped after this call):
# the selection tests 65 passed; at 64k a median 49 keys a row from the bound up (at most 128: 99.8 %),
# the same blocks with every cap; the top-n's 8 launches 1.716 ms gathering up to 128 against 1.624-1.631
# ranking whole rows (64: 1.608-1.619; 256: 1.910-1.927); the forward 30.05-30.39 against 30.07-30.36 ms.
# Then, on main, the probe's section topn (warps a row, each chunk at 64k): the defaults held.
#
#   bash scripts/gpu_session74.sh baseline    # every point of the H200's pytest-benchmark baseline saved
#                                             # again (its prefill points were session 66's kernels,
#                                             # its decode points session 66's too), the JSON to $OUT
#
# 56 points (prefill 145 s, decode 29 s): 64k forward+backward 85.78 / 448.2 ms (5.22x); decode at 64k
# 19.30 / 50.24 us (2.60x) at batch 1, 69.47 / 491.6 (7.08x) at batch 16.
#
#   bash scripts/gpu_session74.sh table       # the prefill table (its plot drawing the new baseline),
#                                             # then the GPU tests of pass 1, the NSA prefill, the
#                                             # compressed kernels and the wgmma check
#
# 8k forward 2.116 / 1.967 ms (0.93x), forward+backward 6.196 / 7.552 (1.22x); 64k 30.20 / 117.7 (3.90x)
# and 85.61 / 448.5 (5.24x). Tests: 71 passed, 4 skipped; wgmma check passed.
#
#   bash scripts/gpu_session74.sh decode      # the decode table (its plot drawing the new baseline)
#
# 64k: batch 1 19.04 / 50.54 us (2.65x), batch 16 70.08 / 493.7 (7.04x), 32 124.3 / 958.7 (7.71x),
# 64 230.3 / 1890 (8.21x); 8k 1.14x and 2.20x.
#   bash scripts/gpu_session74.sh partition   # the window forward on 66, 44, 33 and 22 programs (SMs),
#                                             # the selected forward beside it on a second stream
#                                             # (probe section win_slc_partition), 8k and 64k
#
# Never faster than the two in turn (8k 1.732-1.743 ms, 64k 15.98-16.01): beside a window on 66 programs
# 1.766-1.772 and 15.95-15.97; on 44 1.940 and 16.68; on 33 and 22 slower still. The selected forward
# took about 16 ms at 64k on the 66 SMs the window left (12.1 on all of them).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
topn)
    run_group select 150 4 tests/ops/test_select_kernel.py tests/ops/test_gluon_scores.py
    probe_run 420 topn_gather --only topn_gather --lengths 65536 8192
    ;;
baseline)
    save_baseline h200 280 prefill decode
    ;;
table)
    prefill_table_and_tests
    ;;
decode)
    decode_table h200
    ;;
partition)
    probe_run 400 win_slc_partition --only win_slc_partition --lengths 8192 65536
    ;;
*)
    echo "usage: bash scripts/gpu_session74.sh topn|baseline|table|decode|partition" >&2
    exit 2
    ;;
esac
echo "elapsed $(( $(date +%s) - start )) s"
