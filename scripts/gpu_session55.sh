#!/usr/bin/env bash
# The GPU calls of session 55 (H200). Session 54 made the window's dK/dV walk its bands phased (the
# Hopper tiles' default, e758777) but took no prefill table at those kernels, and the window and
# nsa_attention GPU tests last ran on them at ea3a887. Both first, on main:
#
#   bash scripts/gpu_session55.sh table REV  # (ran at 9ce9529) nsa-bench prefill (8k-64k, dense in the same run), then
#                                            # the window and nsa_attention GPU tests (report named
#                                            # after REV)
#
# The selected dK/dV (12.1 ms of session 53's 64k forward+backward) runs one program per segment of
# at most 1024 queries of a (KV head, block), launched in that order. Each query's q and do rows (8 KB
# a KV head) are read by every segment whose block it chose, about 13 at 64k: 27 GB in all, more than
# the kernel could take from DRAM in its time. Block j's list starts at query 64 j, and every block
# before a query is chosen by it about as often, so segments that start at the same query walk at the
# same pace; in owner order the programs in flight start at consecutive blocks' positions and drift
# apart in proportion. ORDER (new) launches the segments by their first query, per KV head ("query")
# or across them ("query_heads"): bitwise the same results, q and do perhaps from L2:
#
#   bash scripts/gpu_session55.sh order    # (ran at 3e10ec9, on the branch next/sel-order) the selected dK/dV as training launches it in each order
#                                          # (8k, 64k), the kernel lists in place at 64k, the whole
#                                          # forward+backward in ABBA rounds (8k, 64k); then the
#                                          # decode table at batch 1-64 (no decode kernel changed)
#
# Slower alone (8k 1.755-1.760 ms and 1.853-1.854 against 1.702-1.723; 64k 13.47-13.75 and
# 13.86-14.01 against 13.15-13.54), no shorter in place (64k, 5-step lists: 12.45 and 12.70 against
# 12.31 and 12.31) and the whole step the same within noise (64k flushed 99.73-100.00 and
# 99.87-100.03 against 99.55-100.06): dropped (docs/perf/attempts/prefill_selected_dkdv_order.patch).
# The decode table (NSA's step as before) came with it.
#
# The window's dQ recomputes its softmax: three products a step (scores, dP, dS K) against the one
# (dS K) of a dQ that reads the dS which the dK/dV kernel computes anyway. DQ_FROM_DS (new) has the
# dK/dV kernel store every step's dS^T whole (bf16, its key tile's band slots: 5.4 GB at 64k) and the
# dQ read it, the selected branch's initial blocks still recomputed there:
#
#   bash scripts/gpu_session55.sh dqds REV # (ran at 58e4180, on the branch next/window-dq-ds) the window's backward as training launches it, each dQ
#                                          # (8k, 64k); the whole forward+backward, ABBA (8k, 64k); the
#                                          # kernel lists at 64k; the window and nsa_attention GPU tests
#                                          # (report named after REV)
#
# The dQ took 3.25-3.30 ms in place at 64k against 5.03-5.16, but the dK/dV 10.71-10.99 against
# 9.06-9.09 (the stores, and 408 bytes of spills against 360): the kernels summed to 96.87-97.59 ms
# against 96.99-97.09, the whole step 98.06-98.38 ms flushed against 98.31-98.51 and 98.19-98.62 back
# to back against 97.77-98.83 (8k 7.12-7.20 against 7.07-7.17). The GPU tests passed (62, 4 skipped).
# No gain worth 5.4 GB: dropped (docs/perf/attempts/prefill_window_dq_from_ds.patch).
#
# The prefill top-n (1.95 ms at 64k, 8 launches) runs 31 radix rounds a row, one per key bit, each a
# count over the row. Two cheap bounds hold the answer: the least of 16 strided groups' maxima (16
# keys reach it) and the largest key not forced; the bits above the first where they differ are
# theirs, so only the rounds below run:
#
#   bash scripts/gpu_session55.sh topn REV # (ran at 3faaa25) the same blocks either way; the forward and the whole
#                                          # forward+backward in ABBA rounds and the forward's kernel
#                                          # lists (8k, 64k); the select and nsa_attention GPU tests
#
# The same blocks at 8k and 64k; the top-n's 8 launches at 64k took 1.60-1.63 ms in place against
# 1.89-1.93, the forward 33.98-34.38 ms flushed against 34.63-34.77 (every round), the whole
# forward+backward 95.89-97.22 against 97.15-97.36 (back to back 97.07-97.87 against 97.11-97.43); 8k
# unchanged (0.046 ms, rows of at most 128 blocks). The GPU tests passed (73, 4 skipped). Kept. The
# prefill table at these kernels:
#
#   bash scripts/gpu_session55.sh final    # (ran at 5869bba) nsa-bench prefill (8k-64k, dense in the
#                                          # same run)
#
# On another machine: 8k forward 2.191 / 1.921 ms (0.88x), forward+backward 7.160 / 7.477 (1.04x); 64k
# 34.46 / 116.2 (3.37x) and 98.27 / 444.7 (4.53x). The table step's, at 9ce9529: 8k 0.90x and 1.06x,
# 64k 3.41x and 4.54x (100.0 / 454.0); the GPU tests there passed (53, 4 skipped). After the review
# (the top-n's lower bound without a clamp it never needed), the GPU tests of the changed kernel:
#
#   bash scripts/gpu_session55.sh tests REV  # (ran at cce9a9a) the select and nsa_attention GPU tests
#                                            # (report named after REV)
#
# 73 passed, 4 skipped. A second review compiled that kernel for sm_90 offline: without the clamp it
# took 236 registers and spilled 3.3 KB a thread, so the clamp is back (3faaa25's kernel, the one
# measured above).
#
# (The steps order and dqds ran with these probe commands written out; gpu_env.sh's probe_run now
# runs each, the output files named as before.)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session55.sh table REV | order | dqds REV | topn REV | final | tests REV}"
device_line

case "$step" in
table)
    rev="${2:?the table step needs the commit to name the test report after}"
    h200_prefill
    echo "== table after $(( $(date +%s) - start )) s"
    reported_tests 240 "$rev" tests/ops/test_window_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
order)
    probe_run 150 sel_order --lengths 8192 65536 --only sel_order
    probe_run 150 sel_order_step --lengths 8192 65536 --only sel_order_step
    probe_run 120 sel_order_kernels --lengths 65536 --only sel_order_kernels --kernels 8
    decode_table h200
    ;;
dqds)
    rev="${2:?the dqds step needs the commit to name the test report after}"
    probe_run 120 win_dq_ds --lengths 8192 65536 --only win_dq_ds
    probe_run 150 win_dq_ds_step --lengths 8192 65536 --only win_dq_ds_step
    probe_run 100 win_dq_ds_kernels --lengths 65536 --only win_dq_ds_kernels --kernels 10
    reported_tests 200 "$rev" tests/ops/test_window_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
topn)
    rev="${2:?the topn step needs the commit to name the test report after}"
    probe_run 300 topn_bounds --lengths 8192 65536 --only topn_bounds --kernels 6
    reported_tests 200 "$rev" tests/ops/test_select_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
final)
    h200_prefill
    echo "== table after $(( $(date +%s) - start )) s"
    ;;
tests)
    reported_tests 200 "${2:?the tests step needs the commit to name the test report after}" \
        tests/ops/test_select_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
