#!/usr/bin/env bash
# The GPU calls of session 77 (H200). The selected forward walked by block (nsa/ops/selected/by_blocks.py:
# each (chunk of queries, KV head, block) fetches its keys and values once for the chunk's queries that
# chose it, and the last pair of a query merges its partials), weighed in session 52 as the one lever
# left for the 8k forward and built now, behind the launch table's BY_BLOCKS. Measured and dropped: every
# step needs docs/perf/attempts/prefill_selected_by_blocks.patch applied (the module, its launch, its
# CPU tests and the probe's section by_blocks); the outputs are docs/perf/raw/session77_by_blocks_*.
#
#   bash scripts/gpu_session77.sh blocks           # the probe's section by_blocks at 8k and 16k, then
#                                                  # at 64k
#
# Correct (the gated sum within 3.9e-3 of the query-centric kernel's, one bf16 step) but slower:
# 8k 3.19-3.38 ms against 1.255-1.263, 16k 6.60-10.5 against 2.77, 64k 32.0-70.0 against 12.3.
#
#   bash scripts/gpu_session77.sh parts            # by_blocks again at 8k: the merge inline, apart or
#                                                  # not at all, and each form's kernel list
#
# The pairs alone (no merge: a wrong output) 1.01-1.04 ms of kernel at chunk 128, the merge apart 0.66
# more, inline 2.3 more (each merge waits on 16 loads in turn); the inversion 0.1. The whole forward
# with the pairs alone 1.96 against 2.15-2.18: the most the design could give, were merging free.
#
#   bash scripts/gpu_session77.sh unrolled         # parts again, each program's query groups unrolled
#                                                  # (no group's loads wait for the group before)
#
# Slower: the pairs alone 1.43 ms of kernel (1.39-1.62 ms with the inversion) against 1.01, inline merges
# 3.56-4.80. Dropped for the loop (the patch's form).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
blocks)
    probe_run 330 by_blocks --only by_blocks --lengths 8192 16384
    probe_run 200 by_blocks_64k --only by_blocks --lengths 65536
    ;;
parts)
    probe_run 300 by_blocks_parts --only by_blocks --lengths 8192 --kernels 12
    ;;
unrolled)
    probe_run 560 by_blocks_unrolled --only by_blocks --lengths 8192 --kernels 12
    ;;
*)
    echo "usage: bash scripts/gpu_session77.sh blocks|parts|unrolled" >&2
    exit 2
    ;;
esac
