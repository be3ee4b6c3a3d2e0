#!/bin/bash
# The GPU calls of session 31: the profiles' tighter tolerances (docs/tolerances.md) and the
# reference's backward recomputing its query chunks (nsa.ops._reference.map_query_chunks).
#
#   bash scripts/gpu_session31.sh memory           # peak memory and time of the float32 reference's
#                                                  # forward+backward at the GPU tests' real sizes,
#                                                  # chunks kept (before) and recomputed (now)
#   bash scripts/gpu_session31.sh suite REV PART   # one part of the suite but the benchmarks
#                                                  # (gpu_session30.sh suite): kernels or rest
#   bash scripts/gpu_session31.sh tables           # the issue tables again, code unchanged since
#                                                  # session 25: prefill (T 8k-64k) and decode
#                                                  # (batch 1 and 16, graph replay), dense in the same run
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session31.sh memory | suite REV PART | tables}"
case "$step" in
memory)
    device_line
    timeout 400 python "$here/gpu_reference_memory.py" 2>&1 | tee "$OUT/reference_memory.md"
    ;;
suite)
    bash "$here/gpu_session30.sh" suite "${2:?the commit to name the report after}" "${3:?kernels or rest}"
    ;;
tables)
    device_line
    timeout 280 python -m nsa.bench prefill --profile h100 --budget 4 --csv "$OUT/prefill_h100.csv" 2>&1 | tail -8
    timeout 250 python -m nsa.bench decode --profile h100 --batch 1,16 --graph --budget 4 \
        --csv "$OUT/decode_h100.csv" 2>&1 | tail -14
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
