#!/usr/bin/env bash
# The GPU call of session 78 (H200). pytest_nsa engages only where one of its options is given: another
# project's run is left alone (no torch import, detection, flags, xdist pinning, header lines, skips or
# baseline), and `import nsa` loads the ops on first use. Checked on the GPU machine, where a run pays
# CUDA's start as well as torch's import; the outputs are docs/perf/raw/session78_plugin_*.
#
#   bash scripts/gpu_session78.sh plugin           # another project's run, without and with
#                                                  # --gpu-profile auto: its time (3 runs each), what
#                                                  # an xdist worker sees; then the plugin's and the
#                                                  # imports' tests, and the decode graph's GPU tests
#
# Run twice (the first printed no worker line: -s does not reach an xdist worker's output). The second:
# one trivial test 1.56-2.40 s without an option, 5.65-7.25 s with --gpu-profile auto; an xdist worker
# unpinned and without torch, against CUDA_VISIBLE_DEVICES=0 and torch; the tests 206 passed.
# Again at 3470c61 (the review: the plugin's run hooks one class, registered in an engaged run only;
# raw files *_3470c61_*): 1.77-2.88 s against 6.62-8.09 s, the same worker lines, the tests 208 passed.
#
#   bash scripts/gpu_session78.sh final REV        # the whole suite at the session's last code (nsa's
#                                                  # names loaded on first use), in one call: tests/ops,
#                                                  # then the rest, two reports (session 76's step)
#
# At feecc82: tests/ops 393 passed, 17 skipped in 296 s; the rest 794 passed, 4 skipped in 158 s. None failed.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

# Another project: one trivial test, and one that prints what the plugin left an xdist worker. The
# GPU machine has no install: PYTEST_PLUGINS (gpu_env.sh) loads the plugin as the entry point would.
other_project() {
    local dir="$OUT/other"
    mkdir -p "$dir"
    printf 'def test_trivial():\n    assert 1 + 1 == 2\n' > "$dir/test_trivial.py"
    printf '%s\n' 'import os, sys' 'def test_worker():' \
        '    print("WORKER CUDA_VISIBLE_DEVICES=%s torch=%s" % (os.environ.get("CUDA_VISIBLE_DEVICES"), "torch" in sys.modules))' \
        > "$dir/test_worker.py"
    echo "$dir"
}

case "$step" in
plugin)
    dir=$(other_project)
    (
        cd "$dir" || exit 1
        for args in "" "--gpu-profile auto"; do
            for round in 1 2 3; do
                /usr/bin/time -f "== other project, one trivial test [${args:-no option}] round $round: %e s" \
                    python -m pytest -q -p no:cacheprovider $args test_trivial.py 2>&1 | tail -1
            done
            # -rP: an xdist worker's output reaches the controller only as a passed test's report
            timeout 120 python -m pytest -q -p no:cacheprovider -n 2 -rP $args test_worker.py 2>&1 | grep WORKER
        done
    ) 2>&1 | tee "$OUT/plugin_other_project.txt"
    rm -rf "$dir"
    timeout 300 python -m pytest -q -p no:cacheprovider -n 8 tests/plugin tests/test_imports.py \
        tests/test_decode_graph.py 2>&1 | tail -6 | tee "$OUT/plugin_tests.txt"
    ;;
final)
    whole_suite "${2:?final needs the commit to name the reports after}"
    ;;
*)
    echo "usage: bash scripts/gpu_session78.sh plugin|final REV" >&2
    exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
