#!/usr/bin/env bash
# The GPU calls of session 55 (H200). Session 54 made the window's dK/dV walk its bands phased (the
# Hopper tiles' default, e758777) but took no prefill table at those kernels, and the window and
# nsa_attention GPU tests last ran on them at ea3a887. Both first, on main:
#
#   bash scripts/gpu_session55.sh table REV  # nsa-bench prefill (8k-64k, dense in the same run), then
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
#   bash scripts/gpu_session55.sh order    # the selected dK/dV as training launches it in each order
#                                          # (8k, 64k), the kernel lists in place at 64k, the whole
#                                          # forward+backward in ABBA rounds (8k, 64k); then the
#                                          # decode table at batch 1-64 (no decode kernel changed)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session55.sh table REV | order}"
device_line

case "$step" in
table)
    rev="${2:?the table step needs the commit to name the test report after}"
    h200_prefill
    echo "== table after $(( $(date +%s) - start )) s"
    reported_tests 240 "$rev" tests/ops/test_window_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
order)
    timeout 150 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only sel_order 2>&1 \
        | tee "$OUT/prefill_sel_order_h200.txt"
    echo "== alone after $(( $(date +%s) - start )) s"
    timeout 150 python scripts/gpu_prefill_probe.py --lengths 8192 65536 --only sel_order_step 2>&1 \
        | tee "$OUT/prefill_sel_order_step_h200.txt"
    echo "== step after $(( $(date +%s) - start )) s"
    timeout 120 python scripts/gpu_prefill_probe.py --lengths 65536 --only sel_order_kernels --kernels 8 2>&1 \
        | tee "$OUT/prefill_sel_order_kernels_h200.txt"
    echo "== kernels after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
