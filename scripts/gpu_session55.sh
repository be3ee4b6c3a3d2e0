#!/usr/bin/env bash
# The GPU calls of session 55 (H200). Session 54 made the window's dK/dV walk its bands phased (the
# Hopper tiles' default, e758777) but took no prefill table at those kernels, and the window and
# nsa_attention GPU tests last ran on them at ea3a887. Both first, on main:
#
#   bash scripts/gpu_session55.sh table REV  # nsa-bench prefill (8k-64k, dense in the same run), then
#                                            # the window and nsa_attention GPU tests (report named
#                                            # after REV)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session55.sh table REV}"
device_line

case "$step" in
table)
    rev="${2:?the table step needs the commit to name the test report after}"
    h200_prefill
    echo "== table after $(( $(date +%s) - start )) s"
    reported_tests 240 "$rev" tests/ops/test_window_kernel.py tests/ops/test_nsa_attention_kernel.py
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
