#!/bin/bash
# The GPU calls of session 32: addresses past 2**31 elements (tests/ops/test_offsets_past_2_31.py)
# and the float32 reference's forward+backward at 64k (tests/test_long_context.py).
#
#   bash scripts/gpu_session32.sh offsets REV   # those tests and the decode real-size tests (whose
#                                               # reference check is now a shared helper), one at a
#                                               # time; each case's peak memory from the JUnit XML
#   bash scripts/gpu_session32.sh mutants [TEST...] # the same offsets tests (or those named) on a scratch copy of the tree
#                                               # whose kernels compute those offsets in 32 bits
#                                               # (each test in its own process: a wild address
#                                               # leaves the CUDA context unusable); each must fail
#   bash scripts/gpu_session32.sh suite REV PART # one part of the suite but the benchmarks
#                                               # (gpu_session30.sh suite): kernels or rest
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session32.sh offsets REV | mutants [TEST...] | suite REV PART}"
case "$step" in
offsets)
    device_line
    timeout 560 python -m pytest -q -p no:xdist -m "not benchmark" --gpu-profile auto --nsa-report="$OUT" \
        --nsa-report-commit "${2:?the commit to name the report after}" --durations=0 \
        --junitxml="$OUT/offsets.xml" tests/ops/test_offsets_past_2_31.py tests/test_long_context.py \
        "tests/ops/test_decode_kernel.py::test_decode_bf16_real_sizes" 2>&1 | tail -30
    python - "$OUT/offsets.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    print(case.get("name"), case.get("time"), "s", props.get("peak_gib", ""))
PY
    ;;
mutants)
    scratch=/tmp/nsa_mutants
    rm -rf "$scratch" && mkdir -p "$scratch" && cp -r src tests pyproject.toml gpu_profiles "$scratch"/
    cd "$scratch" || exit 1
    export PYTHONPATH=$PWD/src
    ops=src/nsa/ops
    # the row offsets of q, o, do and dq in the shared attention steps and the window kernels
    sed -i 's/return i_b.to(tl.int64) \* stride_b + o_i.to(tl.int64) \* stride_t + o_head.to(tl.int64) \* stride_h/return i_b * stride_b + o_i * stride_t + o_head * stride_h/' $ops/_triton/attention.py
    # the compressed dK/dV's dS rows
    sed -i 's/row0 = (i_b \* H + i_h).to(tl.int64) \* TOTAL + tl.load(ds_off + i_t)/row0 = ((i_b * H + i_h) * TOTAL + tl.load(ds_off + i_t)).to(tl.int32)/' $ops/compressed/kernel.py
    # the selected dS, where the dK/dV writes it and where the dQ reads it
    sed -i 's/(i_b.to(tl.int64) \* T + i_t)/(i_b * T + i_t)/; s/(((i_b.to(tl.int64) \* T + o_i)/(((i_b * T + o_i)/' $ops/selected/kernel.py
    # the decode kernels' sequence index
    sed -i 's/^    return i_b.to(tl.int64), pos$/    return i_b, pos/' $ops/decode/kernel.py
    diff -r "$OLDPWD/src" src | grep -c '^>' | sed 's/^/lines changed: /'
    tests=("test_prefill_past_2_31_elements[B257-T1024-q]" "test_prefill_past_2_31_elements[B33-T1024-selected-dS]"
        "test_prefill_past_2_31_elements[B13-T8192-compressed-dS]" "test_decode_past_2_31_elements")
    [ $# -gt 1 ] && tests=("${@:2}")
    for test in "${tests[@]}"; do
        timeout 200 python -m pytest -q -p no:xdist -p no:cacheprovider --gpu-profile auto --tb=line \
            "tests/ops/test_offsets_past_2_31.py::$test" > "$OUT/mutant.log" 2>&1
        echo "== $test: pytest exit $?"
        grep -E "^(E |/)|passed|failed|skipped|error" "$OUT/mutant.log" | cut -c1-300 | tail -4
    done
    ;;
suite)
    bash "$here/gpu_session30.sh" suite "${2:?the commit to name the report after}" "${3:?kernels or rest}"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
