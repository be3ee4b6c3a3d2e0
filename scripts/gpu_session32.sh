#!/bin/bash
# The GPU calls of session 32: addresses past 2**31 elements (tests/ops/test_offsets_past_2_31.py)
# and the float32 reference's forward+backward at 64k (tests/test_long_context.py).
#
#   bash scripts/gpu_session32.sh offsets REV   # those tests and the decode real-size tests (whose
#                                               # reference check is now a shared helper), one at a
#                                               # time; each case's peak memory from the JUnit XML
#   bash scripts/gpu_session32.sh suite REV PART # one part of the suite but the benchmarks
#                                               # (gpu_session30.sh suite): kernels or rest
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session32.sh offsets REV | suite REV PART}"
case "$step" in
offsets)
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
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
suite)
    bash "$here/gpu_session30.sh" suite "${2:?the commit to name the report after}" "${3:?kernels or rest}"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
