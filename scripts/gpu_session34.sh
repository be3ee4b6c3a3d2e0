#!/bin/bash
# The GPU calls of session 34: packed batches (cu_seqlens) timed under each width of length
# class, and the GPU suite at the session's code.
#
#   bash scripts/gpu_session34.sh varlen [ARGS...]   # scripts/gpu_varlen.py (packs of 64k tokens:
#                                                    # class widths, a cost-model grouping, dense
#                                                    # varlen_attn); ARGS go to the script
#   bash scripts/gpu_session34.sh ab [ARGS...]        # gpu_varlen.py on the session's start (e2d1149,
#                                                    # extracted to ab_old/src: git archive e2d1149 src |
#                                                    # tar -x -C ab_old) and on this tree, twice in turn
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
ab)
    device_line
    for round in 1 2; do
        for tree in ab_old/src src; do
            echo "== round $round, $tree"
            timeout 200 python "$here/gpu_varlen.py" --src "$tree" --widths default --no-dense "$@" 2>&1 \
                | tee -a "$OUT/varlen_ab.md" | grep "^| library"
        done
    done
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
