#!/bin/bash
# The GPU calls of session 34: packed batches (cu_seqlens) timed under each width of length
# class, and the GPU suite at the session's code.
#
#   bash scripts/gpu_session34.sh varlen [ARGS...]   # scripts/gpu_varlen.py (packs of 64k tokens:
#                                                    # class widths, a cost-model grouping, dense
#                                                    # varlen_attn); ARGS go to the script
#   bash scripts/gpu_session34.sh suite REV NAME [PATH...]  # the suite (or PATHs) but the benchmarks,
#                                                    # 12 workers (gpu_session28.sh suite)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session34.sh varlen [ARGS...] | suite REV NAME [PATH...]}"
shift
start=$(date +%s)
case "$step" in
varlen)
    device_line
    timeout 420 python "$here/gpu_varlen.py" "$@" 2>&1 | tee "$OUT/varlen${ROUND:-}.md" | grep -v "^$"
    ;;
suite)
    bash "$here/gpu_session28.sh" suite "$@"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
