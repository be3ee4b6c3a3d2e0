#!/bin/bash
# The GPU calls of session 33: the kernels under Triton 3.8 (the Triton that torch 2.14 pins),
# timed beside the GPU machine's own Triton 3.6 in the same call, and the GPU tests under 3.8.
#
# The GPU machine has torch 2.11 with Triton 3.6 and cannot install packages. Triton 3.8's
# cp312 wheel, trimmed to what compiling and launching on sm_90 needs (libtriton.so stripped;
# no profiler, CUPTI or Blackwell ptxas), travels as .t38/triton38.tar.xz (ignored; carry it):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d /tmp/whl triton==3.8.0
#   unzip -q /tmp/whl/triton-3.8.0-*.whl -d /tmp/t38 && cd /tmp/t38
#   rm -rf triton/instrumentation triton/_C/libproton.so triton/backends/nvidia/lib/cupti* \
#       triton/backends/nvidia/bin/ptxas-blackwell triton/backends/nvidia/bin/nvdisasm
#   strip --strip-unneeded triton/_C/libtriton.so triton/backends/nvidia/bin/*
#   tar -cf - triton triton-3.8.0.dist-info | xz -9 > <repo>/.t38/triton38.tar.xz   # 49 MB
#
#   bash scripts/gpu_session33.sh prefill      # nsa-bench prefill (8k, 64k), Triton 3.6 then 3.8
#   bash scripts/gpu_session33.sh decode       # nsa-bench decode (graph; batch 1 and 16; 8k, 64k), 3.6 then 3.8
#   ORDER="38 36" bash scripts/gpu_session33.sh prefill   # the same, 3.8 first (a second round)
#   bash scripts/gpu_session33.sh suite REV    # the kernel, decode and module GPU tests under 3.8
#                                              # (scripts/triton_over_pin.py lets the plugin run them)
#
# Each Triton gets its own cache folder; ROUND (e.g. _r2) suffixes the CSV names. Everything it prints or writes goes to $OUT.
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session33.sh prefill | decode | suite REV}"
start=$(date +%s)
t38=/tmp/t38
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"

# Unpack Triton 3.8 once per machine; a tiny kernel proves that it compiles and runs here.
if [ ! -d "$t38/triton" ]; then
    [ -f .t38/triton38.tar.xz ] || { echo "no .t38/triton38.tar.xz: carry .t38"; exit 3; }
    mkdir -p "$t38" && tar -xJf .t38/triton38.tar.xz -C "$t38" || exit 3
fi
with_triton() {  # with_triton 36|38 COMMAND...: run COMMAND under that Triton, its own cache
    local version="$1"
    shift
    if [ "$version" = 38 ]; then
        PYTHONPATH="$t38:$PYTHONPATH" TRITON_CACHE_DIR=/tmp/triton_cache_38 "$@"
    else
        TRITON_CACHE_DIR=/tmp/triton_cache_36 "$@"
    fi
}
for v in 36 38; do
    with_triton $v python "$here/triton_smoke.py" 2>&1 | tail -3 | tee -a "$OUT/versions.txt" || exit 3
done

case "$step" in
prefill)
    for v in ${ORDER:-36 38}; do
        echo "== prefill, triton $v ($(( $(date +%s) - start )) s)"
        with_triton $v timeout 270 python -m nsa.bench prefill --profile h100 --lengths 8192,65536 --budget 4 \
            --csv "$OUT/prefill_triton$v${ROUND:-}.csv" 2>&1 | tail -5
    done
    ;;
decode)
    for v in ${ORDER:-36 38}; do
        echo "== decode, triton $v ($(( $(date +%s) - start )) s)"
        with_triton $v timeout 270 python -m nsa.bench decode --profile h100 --batch 1,16 --contexts 8192,65536 \
            --graph --no-branches --budget 4 --csv "$OUT/decode_triton$v${ROUND:-}.csv" 2>&1 | tail -7
    done
    ;;
suite)
    rev="${2:?the commit to name the report after}"
    rm -rf /tmp/triton_cache_38
    with_triton 38 timeout 540 python -m pytest -v -p no:cacheprovider -p triton_over_pin -n 12 --dist worksteal \
        -m "not benchmark" --gpu-profile auto -rfE --tb=short -p pytest_failures_now --nsa-report="$OUT" \
        --nsa-report-commit "$rev" tests/ops --ignore=tests/ops/test_offsets_past_2_31.py tests/test_decode_graph.py \
        tests/test_module.py tests/test_cache.py tests/test_varlen.py tests/test_identities.py \
        > "$OUT/suite_triton38.txt" 2>&1
    echo "suite under triton 3.8: rc $?, $(( $(date +%s) - start )) s"
    grep -E "FAILED|ERROR" "$OUT/suite_triton38.txt" | head -30
    tail -4 "$OUT/suite_triton38.txt"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
