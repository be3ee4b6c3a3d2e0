# Sourced by scripts/gpu_sessionNN.sh: strict pipes, the repository root as the working folder,
# nsa and its pytest plugin importable from the checkout (the GPU machine has no install), and
# $OUT, the folder whose files the device tool brings back.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD/src:$PWD/scripts PYTEST_PLUGINS=pytest_nsa.plugin PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nsa_out}"
mkdir -p "$OUT"
start=$(date +%s)  # the sourcing script's start, for the elapsed times it prints

# The GPU's name, driver and clock, printed and kept as $OUT/device.txt: each call's first line.
device_line() {
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
}

# GPU tests on 3 workers with a validation report in $OUT: gpu_tests REV FILE... (report named
# after REV; at most 300 s, the tail of the output shown).
gpu_tests() {
    local rev="${1:?gpu_tests needs the commit to name the report after}"
    shift
    timeout 300 python -m pytest -q -n 3 -m "not benchmark" --gpu-profile auto --nsa-report="$OUT" \
        --nsa-report-commit "$rev" "$@" 2>&1 | tail -8
}

# The decode GPU tests (kernels, graph, cache, module), the report named after $1.
decode_gpu_tests() {
    gpu_tests "${1:?the decode tests need the commit to name the report after}" \
        tests/ops/test_decode_kernel.py tests/test_decode_graph.py tests/test_cache.py tests/test_module.py
}

# On an H200 only (returns 3 elsewhere): the decode table (nsa-bench), the batch-1 floors at 64k
# and the 8-layer graph.
h200_decode() {
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200"; return 3; }
    python -m nsa.bench decode --profile h200 --batch 1,16 --graph --budget 4 --csv "$OUT/decode_h200.csv" \
        --plot "$OUT/decode_h200.png" 2>&1 | tail -14
    timeout 150 python scripts/gpu_decode_floor.py --context 65536 2>&1 | tee "$OUT/decode_floor_64k_h200.md" | tail -20
    timeout 120 python scripts/gpu_decode_layers.py --contexts 65536 2>&1 | tee "$OUT/decode_layers_h200.md" | tail -8
}

# The decode table at batch 1, 16, 32 and 64 (nsa-bench, graph replay, L2 flushed, dense in the
# same run; $OUT/decode_PROFILE.{csv,png}):
#   decode_table PROFILE
decode_table() {
    local profile="${1:?decode_table needs the GPU profile}"
    timeout 200 python -m nsa.bench decode --profile "$profile" --batch 1,16,32,64 --graph --budget 4 \
        --csv "$OUT/decode_$profile.csv" --plot "$OUT/decode_$profile.png" 2>&1 | tail -24
    echo "== table: rc $? after $(( $(date +%s) - start )) s"
}

# The profile's pytest-benchmark baseline points of each KIND (prefill, decode) saved again, each
# under LIMIT seconds, the logs in $OUT/baseline_KIND.log, the baseline JSON copied to $OUT:
#   save_baseline PROFILE LIMIT KIND...
save_baseline() {
    local profile="${1:?save_baseline needs the GPU profile}" limit="${2:?save_baseline needs a limit}"
    shift 2
    for kind in "$@"; do
        timeout "$limit" python -m pytest tests/benchmarks -k "$kind" --gpu-profile "$profile" --nsa-baseline=save \
            -p no:cacheprovider -q > "$OUT/baseline_$kind.log" 2>&1
        echo "== baseline $kind: rc $? after $(( $(date +%s) - start )) s"
        tail -4 "$OUT/baseline_$kind.log"
    done
    cp "gpu_profiles/baselines/$profile/benchmarks.json" "$OUT/"
}

# decode_table, then the decode points of the profile's pytest-benchmark baseline saved again
# (save_baseline):
#   decode_table_and_baseline PROFILE
decode_table_and_baseline() {
    local profile="${1:?decode_table_and_baseline needs the GPU profile}"
    decode_table "$profile"
    save_baseline "$profile" 150 decode
}

# The report folders in $OUT, and worker_tests' tests.txt where there is one, as one tar,
# $OUT/report.tar (the device tool brings back eight files).
tar_reports() {
    (cd "$OUT" && tar -cf report.tar nvidia-* && { [ ! -f tests.txt ] || tar -rf report.tar tests.txt; } \
        && rm -rf nvidia-* tests.txt)
}

# worker_tests, then the report folder as one tar: reported_tests LIMIT REV TEST...
reported_tests() {
    worker_tests "$@"
    tar_reports
}

# The GPU tests of the layer, its compiled forms, its captured decode step and the cache, as one
# reported tar: layer_gpu_tests REV (sessions 44-45's "module" step).
layer_gpu_tests() {
    reported_tests 420 "${1:?the commit to name the report after}" tests/test_module.py tests/test_compile.py \
        tests/test_decode_graph.py tests/test_cache.py
}

# On an H200 only (returns 3 elsewhere): the prefill table (nsa-bench, 8k-64k).
h200_prefill() {
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200"; return 3; }
    python -m nsa.bench prefill --profile h200 --budget 4 --csv "$OUT/prefill_h200.csv" --plot "$OUT/prefill_h200.png" \
        2>&1 | tail -8
}

# The prefill table (h200_prefill), then the GPU tests of the compressed forward's pass 1, the NSA
# prefill and the compressed kernels, and the check that no library kernel has its wgmma serialised
# (sessions 69-70's "final" step; run_group names their outputs after the calling script's step).
prefill_table_and_tests() {
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    run_group nsa 200 8 tests/ops/test_gluon_pass1.py tests/ops/test_nsa_attention_kernel.py \
        tests/ops/test_compressed_kernel.py
    run_group wgmma 150 1 tests/ops/test_wgmma_serialisation.py
}

# One scripts/gpu_prefill_probe.py run under a time limit, its output shown and kept as
# $OUT/prefill_NAME_h200.txt, then the elapsed time: probe_run LIMIT NAME PROBE-ARG...
probe_run() {
    local limit="$1" name="$2"
    shift 2
    timeout "$limit" python scripts/gpu_prefill_probe.py "$@" 2>&1 | tee "$OUT/prefill_${name}_h200.txt"
    echo "== $name after $(( $(date +%s) - start )) s"
}

# One pytest of GPU tests under its own time limit, so that a slow group cannot hide another's
# failures: run_group NAME LIMIT WORKERS TEST... writes $OUT/${step}_NAME.txt (step: the calling
# script's step) and shows its tail; $start is the calling script's start time.
run_group() {
    local name="$1" limit="$2" workers="$3"
    shift 3
    timeout "$limit" python -m pytest -q -p no:cacheprovider -n "$workers" --gpu-profile auto -rs --tb=short \
        --durations=8 "$@" > "$OUT/${step}_$name.txt" 2>&1
    echo "== $name: rc $? after $(( $(date +%s) - start )) s"
    grep -v -i "warn" "$OUT/${step}_$name.txt" | tail -20
}

# GPU tests on 8 workers sharing the GPU, the output in $OUT/tests.txt and its failures shown:
# worker_tests LIMIT REV TEST... (report named after REV; $start is the calling script's start).
worker_tests() {
    local limit="$1" rev="$2"
    shift 2
    timeout "$limit" python -m pytest -q -p no:cacheprovider -n 8 --dist worksteal -m "not benchmark" \
        --gpu-profile auto -rfEs --tb=short --nsa-report="$OUT" --nsa-report-commit "$rev" "$@" > "$OUT/tests.txt" 2>&1
    echo "== tests: rc $? after $(( $(date +%s) - start )) s"
    grep -E "FAILED|ERROR" "$OUT/tests.txt" | head -20
    tail -3 "$OUT/tests.txt"
}

# The same, each test's outcome on its own line (which ran, when a limit stops the run) and the 12
# slowest: verbose_tests LIMIT REV NAME TEST... writes $OUT/tests_NAME.txt.
verbose_tests() {
    local limit="$1" rev="$2" name="$3"
    shift 3
    timeout "$limit" python -m pytest -v -p no:cacheprovider -n 8 --dist worksteal -m "not benchmark" \
        --gpu-profile auto -rfEs --tb=short --durations=12 --nsa-report="$OUT" --nsa-report-commit "$rev" "$@" \
        > "$OUT/tests_$name.txt" 2>&1
    echo "== tests $name: rc $? after $(( $(date +%s) - start )) s"
    grep -E "FAILED|ERROR" "$OUT/tests_$name.txt" | head -20
    tail -3 "$OUT/tests_$name.txt"
}

# The whole suite but the benchmarks in one call: tests/ops, then the rest, two reports named after REV,
# with both outputs, as one tar (sessions 76 and 78's "final"):
#   whole_suite REV
whole_suite() {
    local rev="${1:?whole_suite needs the commit to name the reports after}"
    worker_tests 330 "$rev" tests/ops
    mv "$OUT/tests.txt" "$OUT/tests_ops.txt"
    worker_tests 240 "$rev" tests --ignore=tests/ops --ignore=tests/benchmarks
    (cd "$OUT" && tar -cf report.tar nvidia-* tests_ops.txt tests.txt && rm -rf nvidia-* tests_ops.txt tests.txt)
}

# One side of an A/B against a copy of an older src/: ab_side SIDE OLD_SRC sets $side_src to this
# tree's src/ ("new") or to OLD_SRC ("old") and prints the side and the elapsed time.
ab_side() {
    side_src="$PWD/src"
    [ "$1" = old ] && side_src="$PWD/${2:?ab_side needs the folder of the old src/}"
    echo "== $1 ($side_src) after $(( $(date +%s) - start )) s"
}

# scripts/gpu_compile.py once per "LENGTH VALUE" pair, VALUE given as --OPTION (dtype, mode):
# compile_runs LIMIT OPTION PAIR... writes $OUT/compile_LENGTH_VALUE.md and shows its table.
compile_runs() {
    local limit="$1" option="$2"
    shift 2
    for run in "$@"; do
        set -- $run
        timeout "$limit" python scripts/gpu_compile.py --length "$1" "--$option" "$2" 2>&1 \
            | tee "$OUT/compile_$1_$2.md" | grep -v "^$"
        echo "== compile $1 $2 after $(( $(date +%s) - start )) s"
    done
}

# The decode step's kernels (gpu_decode_step_profile.py, every kernel) into $OUT/decode_step_profile.md.
step_profile() {
    timeout 60 python scripts/gpu_decode_step_profile.py 2>&1 | grep -v "^W[0-9][0-9][0-9][0-9] \|Warning\|_warn_once" \
        > "$OUT/decode_step_profile.md"
    grep "^###" "$OUT/decode_step_profile.md"
}

# Decode steps (gpu_decode_compiled.py ARGS...) of OLD_SRC and this tree, three times in turn, the
# old first: decode_rounds OLD_SRC LIMIT NAME ARGS... appends the rows to $OUT/NAME_{old,new}.md.
decode_rounds() {
    local old="$1" limit="$2" name="$3"
    shift 3
    for side in old new old new old new; do
        ab_side "$side" "$old"
        PYTHONPATH="$side_src:$PWD/scripts" timeout "$limit" python scripts/gpu_decode_compiled.py "$@" 2>&1 \
            | grep "^| [0-9]" | tee -a "$OUT/${name}_$side.md"
    done
}

# DecodeGraph steps (gpu_decode_compiled.py) of every side in turn, for each argument set:
# side_rounds NAME "SIDE..." ARGS... appends the rows to $OUT/NAME_steps.md, each led by its side
# and arguments (one file: the device tool brings back eight). The sides are the folders of src/
# in the array "sides" (set by the calling script), by name; "new" is this tree's.
declare -A sides
side_rounds() {
    local name="$1" side_list="$2" args side src_dir
    shift 2
    for args in "$@"; do
        for side in $side_list; do
            src_dir="$PWD/src"
            [ "$side" != new ] && src_dir="$PWD/${sides[$side]}"
            echo "== $side ($args) after $(( $(date +%s) - start )) s"
            PYTHONPATH="$src_dir:$PWD/scripts" timeout 60 python scripts/gpu_decode_compiled.py $args 2>&1 \
                | grep "^| [0-9]" | sed "s/^/| $side | $args /" | tee -a "$OUT/${name}_steps.md"
        done
    done
}

# GPU tests (verbose_tests), then DecodeGraph steps of the sides in turn (side_rounds), then the
# step's kernels (step_profile): tests_and_steps LIMIT REV NAME "TEST..." "SIDE..." ARGS...
tests_and_steps() {
    local limit="$1" rev="$2" name="$3" tests="$4" side_list="$5"
    shift 5
    verbose_tests "$limit" "$rev" "$name" $tests
    side_rounds "$name" "$side_list" "$@"
    step_profile
}

# scripts/gpu_decode.py at one batch: the default and each launch variant (JSON) in turn, twice, every
# variant checked against the float32 reference at context CHECK; the report goes to
# $OUT/decode_NAME_h200.md and its variant lines are shown (sessions 42, 43).
#   variant_rounds NAME BATCH CHECK "CONTEXTS" LIMIT_S LAUNCH...
variant_rounds() {
    local name="$1" batch="$2" check="$3" contexts="$4" limit="$5" launch
    shift 5
    local launches=()
    for launch in "$@"; do
        launches+=(--launch "$launch")
    done
    # shellcheck disable=SC2086 # the contexts are several arguments
    timeout "$limit" python scripts/gpu_decode.py --contexts 4096 --batches "$batch" --check-contexts "$check" \
        --variants $contexts --check-variants "${launches[@]}" --launch '{}' "${launches[@]}" \
        --out "$OUT/decode_${name}_h200.md" > "$OUT/$name.log" 2>&1
    echo "== $name: rc $? after $(( $(date +%s) - start )) s"
    grep -E "^- B=|^Launch|variant" "$OUT/decode_${name}_h200.md" | sed 's/ (cmp_win_fwd/ (cmp/'
}

# The A/B of a decode change (session 47's form): the given tests on this tree (at most 150 s, the
# report named after REV, as one tar), then decode steps of ab_base/src (a git archive of the tree
# before) and of this one in turn, three times, at $AB_POINTS, rows in $OUT/decode_NAME_h200.md:
#   decode_ab NAME REV TEST...
decode_ab() {
    local name="$1" rev="${2:?decode_ab needs the commit to name the report after}"
    shift 2
    [ -d ab_base/src/nsa ] || { echo "no ab_base/src (git archive of the tree before)" >&2; return 2; }
    reported_tests 150 "$rev" "$@"
    ab_rounds "$name" 3 120 base new || true  # its status is its last grep's: the rows are the result
}

# Decode steps (scripts/gpu_decode_ab.py) of each side in turn, ROUNDS times, the rows appended to
# $OUT/decode_NAME_h200.md: side "new" is this tree, any other the folder ab_SIDE/src (a git archive
# of that tree's src/; sessions 43 and 44). $AB_POINTS, where set, replaces the script's points
# (batch:context pairs).
#   ab_rounds NAME ROUNDS LIMIT_S SIDE...
ab_rounds() {
    local name="$1" rounds="$2" limit="$3" side src_dir
    shift 3
    for _ in $(seq "$rounds"); do
        for side in "$@"; do
            src_dir="$PWD/src"
            [ "$side" != new ] && src_dir="$PWD/ab_$side/src"
            echo "== $side ($src_dir) after $(( $(date +%s) - start )) s"
            # shellcheck disable=SC2086 # the points are several arguments
            PYTHONPATH="$src_dir:$PWD/scripts" timeout "$limit" python scripts/gpu_decode_ab.py --name "$side" \
                ${AB_POINTS:+--points $AB_POINTS} 2>&1 \
                | grep "^| " | tee -a "$OUT/decode_${name}_h200.md"
        done
    done
}

# Every decode program's timer stamps (scripts/gpu_decode_trace.py, five replays at $CONTEXT, 64k
# unless set; the variants as decode_fwd overrides in JSON) into $OUT/decode_trace_NAME_h200.md, the
# spreads shown (sessions 50-52):
#   [CONTEXT=N] decode_stamps NAME LIMIT_S "BATCHES" VARIANT...
decode_stamps() {
    local name="$1" limit="$2" batches="$3"
    shift 3
    # shellcheck disable=SC2086 # the batches are several arguments
    timeout "$limit" python scripts/gpu_decode_trace.py --contexts "${CONTEXT:-65536}" --batches $batches --replays 5 \
        --variants "$@" 2>&1 | tee "$OUT/decode_trace_${name}_h200.md" \
        | grep -E "^B=|^  [a-z]|end:|wait over:|before|top-n|start:|candidates:|arrived:|scored:|row-group done:"
}

# scripts/gpu_gluon_bwd_probe.py's configurations in the order given, each in a process of its own
# under a timeout (a hung Gluon kernel holds the GPU), appended to $OUT/gluon_bwd_probe_h200.txt
# (sessions 61-62): bwd_probe CONFIG...
bwd_probe() {
    local i
    for i in "$@"; do
        timeout 100 python scripts/gpu_gluon_bwd_probe.py --configs "$i" 2>&1 | grep -v "^device" \
            | tee -a "$OUT/gluon_bwd_probe_h200.txt"
        [ "${PIPESTATUS[0]}" -eq 124 ] && echo "config $i: timed out (100 s)" | tee -a "$OUT/gluon_bwd_probe_h200.txt"
    done
}

# A Gluon kernel's GPU tests (sessions 63-64): the tests given, in $OUT/gluon_tests.txt with its tail
# shown; stops the call when one fails, so that no time goes to timing a wrong kernel:
#   gluon_tests LIMIT TEST...
gluon_tests() {
    local limit="$1"
    shift
    timeout "$limit" python -m pytest -q -p no:cacheprovider --gpu-profile auto -rs --tb=short "$@" \
        > "$OUT/gluon_tests.txt" 2>&1
    local rc=$?
    tail -6 "$OUT/gluon_tests.txt"
    [ "$rc" = 0 ] || { echo "== tests failed (rc $rc): no timing"; exit 1; }
    echo "== tests after $(( $(date +%s) - start )) s"
}

# The differential fuzzer's tests (tests/test_fuzz.py) on 8 xdist workers with a report in $OUT named
# after REV, stopped by SIGINT (its summary still printed) LIMIT seconds after the sourcing script's
# start; the output in $OUT/fuzz.txt, its failures and summary shown, the report tarred:
#   fuzz_tests REV LIMIT PYTEST_ARGS...   (--fuzz-seed/--fuzz-cases, node ids)
fuzz_tests() {
    local rev="${1:?fuzz_tests needs the commit}" limit="${2:?fuzz_tests needs a limit}"
    shift 2
    timeout -s INT -k 30 $(( limit - ($(date +%s) - start) )) python -m pytest -p no:cacheprovider -n 8 \
        --dist worksteal -v --gpu-profile auto -rfEs --tb=short --nsa-report="$OUT" --nsa-report-commit "$rev" \
        "$@" > "$OUT/fuzz.txt" 2>&1
    echo "== fuzz: rc $? after $(( $(date +%s) - start )) s"
    grep -cE "PASSED" "$OUT/fuzz.txt" | sed 's/^/== passed lines: /'
    grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/fuzz.txt" | head -40
    tail -3 "$OUT/fuzz.txt"
    tar_reports
}
