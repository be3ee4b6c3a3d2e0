#!/usr/bin/env bash
# The GPU calls of session 43 (H200). Batch 16 at 64k misses the decode issue's 7x there (6.2x):
# after the compressed pass (39 us of the step's 79), the score, selected and combine launches run
# while the DRAM moves little. Does splitting the batch into parts, each a whole decode step on its
# own stream (the later parts at lower priority), let a later part's compressed pass fill that gap?
#
#   bash scripts/gpu_session43.sh chains      # scripts/gpu_decode_chains.py: batch 16, 32, 64 at 8k and
#                                             # 64k as one chain, 2 or 4 parts in turn, on streams of equal
#                                             # or falling priority; the batch-16 step's kernels in a replay
#   bash scripts/gpu_session43.sh variants    # batch 16 and 32 (8k, 64k): score tiles of 64 blocks (half the
#                                             # candidates each selection program ranks), 2 selected blocks a
#                                             # program, both, against the defaults; twice each
#   bash scripts/gpu_session43.sh ab          # the decode GPU tests on this tree, then decode steps of ab_base/src
#                                             # (git archive of the tree before: "base", "old" in its raw files)
#                                             # and this one ("new") in turn, three rounds (gpu_env.sh's ab_rounds)
#   bash scripts/gpu_session43.sh fix REV     # the score launch without FMA fusion: the new candidates test on
#                                             # ab_base/src (before: expected to fail), the decode GPU tests on
#                                             # this tree (report named after REV, as one tar), then decode steps
#                                             # of both trees in turn, twice
#   bash scripts/gpu_session43.sh table REV   # the decode GPU tests (report named after REV), the decode
#                                             # table at batch 1, 16, 32 and 64 (nsa-bench, graph replay),
#                                             # the decode points of the H200's pytest-benchmark baseline
#                                             # saved again, and DecodeGraph steps (the module) at batch 16
#   bash scripts/gpu_session43.sh tests REV   # the decode GPU tests alone, their report folder as one tar (the
#                                             # device tool brings back eight files; the table's call had nine)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session43.sh chains | variants | ab | fix REV | table REV | tests REV}"
device_line
case "$step" in
chains)
    timeout 330 python "$here/gpu_decode_chains.py" --contexts 65536 8192 --batches 16 32 64 --chains 2 4 \
        2>&1 | tee "$OUT/decode_chains_h200.md" | grep -v "^$"
    echo "== chains: rc $? after $(( $(date +%s) - start )) s"
    timeout 90 python "$here/gpu_decode_timeline.py" --contexts 65536 --batches 16 2>&1 \
        | tee "$OUT/decode_timeline_b16_h200.md" | tail -25
    echo "== timeline: rc $? after $(( $(date +%s) - start )) s"
    ;;
variants)
    variant_rounds variants_b16 16 8192 "8192 65536" 200 '{"score_blocks": 64}' '{"splits": [6, 2, 2]}' \
        '{"score_blocks": 64, "splits": [6, 2, 2]}' '{"score_blocks": 64, "score_warps": 2}'
    variant_rounds variants_b32 32 8192 "8192 65536" 150 '{"score_blocks": 64}' '{"score_blocks": 64, "score_warps": 2}'
    ;;
ab)
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src: git archive the tree before there" >&2; exit 2; }
    timeout 240 python -m pytest -q -p no:cacheprovider -n 8 --dist worksteal -m "not benchmark" --gpu-profile auto \
        -rfE --tb=short tests/ops/test_decode_kernel.py tests/test_decode_graph.py tests/test_cache.py 2>&1 | tail -4
    echo "== tests: after $(( $(date +%s) - start )) s"
    ab_rounds ab 3 150 base new
    ;;
fix)
    rev="${2:?the commit to name the report after}"
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src: git archive the tree before there" >&2; exit 2; }
    PYTHONPATH="$PWD/ab_base/src:$PWD/scripts" timeout 120 python -m pytest -q -p no:cacheprovider --gpu-profile auto \
        -rfE --tb=line tests/ops/test_decode_kernel.py -k keep_n_candidates 2>&1 | grep -E "passed|failed|assert" | tail -3
    echo "== the new test on the tree before: after $(( $(date +%s) - start )) s"
    reported_tests 200 "$rev" tests/ops/test_decode_kernel.py tests/test_decode_graph.py tests/test_cache.py \
        tests/ops/test_launch_options.py
    ab_rounds fix_ab 2 100 base new
    ;;
table)
    rev="${2:?the commit to name the report after}"
    worker_tests 200 "$rev" tests/ops/test_decode_kernel.py tests/test_decode_graph.py tests/test_cache.py
    decode_table_and_baseline h200
    timeout 60 python "$here/gpu_decode_compiled.py" --contexts 4096,65536 --batch 16 --ways DecodeGraph 2>&1 \
        | tee "$OUT/decode_graph_b16_h200.md" | grep "^|"
    ;;
tests)
    reported_tests 200 "${2:?the commit to name the report after}" tests/ops/test_decode_kernel.py \
        tests/test_decode_graph.py tests/test_cache.py
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
