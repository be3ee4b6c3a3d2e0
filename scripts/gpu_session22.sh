#!/bin/bash
# The GPU calls of session 22 (docs/perf/decode.md, "Session 22"):
#
#   bash scripts/gpu_session22.sh decode <rev>  # the selection programs score their row themselves
#                                               # (no score launch) against the score launch:
#                                               # correctness and graph timings (8k-64k; B = 1, 16;
#                                               # gpu_decode.py variants), each kernel's span in a
#                                               # batch-1 replay, then the decode GPU tests, the
#                                               # report named after <rev>. It ran at dfd7ae4, whose
#                                               # decode_fwd(score_in_selected=...) was dropped
#                                               # (attempts/decode_score_in_selected_masses.patch):
#                                               # apply that patch to repeat it
#   bash scripts/gpu_session22.sh early         # the selected forward with the first queries of a
#                                               # sequence in tiles of several positions, by schedule,
#                                               # and the whole prefill with and without (8k-64k). It
#                                               # ran at 4a2c2ec, whose EARLY_TILES and probe section
#                                               # early_tiles were dropped (the kernel change is
#                                               # attempts/prefill_selected_early_tiles.patch)
#
# The decode table and the GPU suite in parts are scripts/gpu_session21.sh's table and suite steps.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
case "${1:?usage: scripts/gpu_session22.sh decode REV|early}" in
decode)
    CONTEXTS="8192 16384 32768 65536" AGAINST='{"score_in_selected": false}' \
        bash scripts/gpu_session21.sh decode "${2:?decode needs the commit to name the report after}"
    ;;
early)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_prefill_probe.py --only early_tiles --lengths 8192 16384 65536 2>&1 | tee "$OUT/early_tiles.txt"
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
