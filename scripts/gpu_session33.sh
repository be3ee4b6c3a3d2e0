#!/bin/bash
# The GPU calls of session 33: the kernels under Triton 3.8 (the Triton that torch 2.14 pins) and
# 3.9 (the newest; CI's interpreter), timed beside the GPU machine's own Triton 3.6 in the same
# call, and the GPU tests under them.
#
# The GPU machine has torch 2.11 with Triton 3.6 and cannot install packages. A newer Triton's
# cp312 wheel, trimmed to what compiling and launching on sm_90 needs, travels as
# .tNN/tritonNN.tar.xz (ignored; carry .tNN), under 64 MiB with the tree:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d /tmp/whl triton==3.8.0
#   mkdir /tmp/t38 && cd /tmp/t38 && unzip -q /tmp/whl/triton-3.8.0-*.whl
#   rm -rf triton/instrumentation triton/_C/libproton.so triton/backends/nvidia/lib/cupti* \
#       triton/backends/nvidia/bin/nvdisasm triton/backends/nvidia/bin/ptxas-blackwell
#   strip --strip-unneeded triton/_C/libtriton.so triton/backends/nvidia/bin/*
#   tar -cf - triton triton-3.8.0.dist-info | xz -9 > <repo>/.t38/triton38.tar.xz   # 49 MB
#
# Triton 3.9 compiles sm_90 with ptxas-blackwell: remove bin/ptxas instead, and also
# triton/backends/amd/lib/libtriton_amd_codegen.so (53 MB).
#
#   bash scripts/gpu_session33.sh prefill      # nsa-bench prefill (8k, 64k) under each Triton of ORDER
#   bash scripts/gpu_session33.sh decode       # nsa-bench decode (graph; batch 1 and 16; 8k, 64k), the same
#   ORDER=39 bash scripts/gpu_session33.sh fusion  # with the launches' enable_fp_fusion=True: no
#                                              # fusion warning from the kernel tests, and the prefill
#                                              # with TRITON_DEFAULT_FP_FUSION unset, then 0 (no change)
#   bash scripts/gpu_session33.sh suite REV    # the kernel, decode and module GPU tests under the last
#                                              # Triton of ORDER (scripts/triton_over_pin.py lets the
#                                              # plugin run them)
#
# ORDER (default "36 38") lists the Tritons in the order they run; ROUND (e.g. _r2) suffixes the
# output names. Each Triton gets its own cache folder. Everything it prints or writes goes to $OUT.
here="$(dirname "$0")"
. "$here/gpu_env.sh"
step="${1:?usage: scripts/gpu_session33.sh prefill | decode | fusion | suite REV}"
start=$(date +%s)
device_line

# A newer Triton NN travels as .tNN/tritonNN.tar.xz and is unpacked once per machine into
# /tmp/tNN; a tiny kernel proves that each Triton in ORDER compiles and runs here.
order="${ORDER:-36 38}"
for v in $order; do
    [ "$v" = 36 ] || [ -d "/tmp/t$v/triton" ] && continue
    [ -f ".t$v/triton$v.tar.xz" ] || { echo "no .t$v/triton$v.tar.xz: carry .t$v"; exit 3; }
    mkdir -p "/tmp/t$v" && tar -xJf ".t$v/triton$v.tar.xz" -C "/tmp/t$v" || exit 3
done
with_triton() {  # with_triton 36|NN COMMAND...: run COMMAND under that Triton, its own cache
    local version="$1"
    shift
    if [ "$version" = 36 ]; then
        TRITON_CACHE_DIR=/tmp/triton_cache_36 "$@"
    else
        PYTHONPATH="/tmp/t$version:$PYTHONPATH" TRITON_CACHE_DIR="/tmp/triton_cache_$version" "$@"
    fi
}
for v in $order; do
    with_triton $v python "$here/triton_smoke.py" 2>&1 | tail -3 | tee -a "$OUT/versions.txt" || exit 3
done

case "$step" in
prefill)
    for v in $order; do
        echo "== prefill, triton $v ($(( $(date +%s) - start )) s)"
        with_triton $v timeout 270 python -m nsa.bench prefill --profile h100 --lengths 8192,65536 --budget 4 \
            --csv "$OUT/prefill_triton$v${ROUND:-}.csv" 2>&1 | tail -5
    done
    ;;
decode)
    for v in $order; do
        echo "== decode, triton $v ($(( $(date +%s) - start )) s)"
        with_triton $v timeout 270 python -m nsa.bench decode --profile h100 --batch 1,16 --contexts 8192,65536 \
            --graph --no-branches --budget 4 --csv "$OUT/decode_triton$v${ROUND:-}.csv" 2>&1 | tail -7
    done
    ;;
fusion)
    v="${order##* }"
    with_triton "$v" env -u TRITON_DEFAULT_FP_FUSION timeout 200 python -m pytest -q -p no:cacheprovider \
        -p triton_over_pin --gpu-profile auto -rw tests/ops/test_launch_options.py tests/ops/test_gates_kernel.py \
        > "$OUT/fusion_tests.txt" 2>&1
    echo "launch-option tests: rc $?; fusion warnings: $(grep -c TRITON_DEFAULT_FP_FUSION "$OUT/fusion_tests.txt")"
    tail -2 "$OUT/fusion_tests.txt"
    for fusion in unset 0; do
        echo "== prefill, triton $v, TRITON_DEFAULT_FP_FUSION $fusion ($(( $(date +%s) - start )) s)"
        if [ "$fusion" = unset ]; then run=(env -u TRITON_DEFAULT_FP_FUSION); else run=(env TRITON_DEFAULT_FP_FUSION=0); fi
        with_triton "$v" "${run[@]}" timeout 200 python -m nsa.bench prefill --profile h100 --lengths 8192,65536 \
            --budget 2 --csv "$OUT/prefill_triton${v}_fusion_$fusion.csv" 2>&1 | tail -3
    done
    ;;
suite)
    rev="${2:?the commit to name the report after}" v="${order##* }"
    rm -rf "/tmp/triton_cache_$v"
    with_triton "$v" timeout 540 python -m pytest -v -p no:cacheprovider -p triton_over_pin -n 12 --dist worksteal \
        -m "not benchmark" --gpu-profile auto -rfE --tb=short -p pytest_failures_now --nsa-report="$OUT" \
        --nsa-report-commit "$rev" tests/ops --ignore=tests/ops/test_offsets_past_2_31.py tests/test_decode_graph.py \
        tests/test_module.py tests/test_cache.py tests/test_varlen.py tests/test_identities.py \
        > "$OUT/suite_triton$v${ROUND:-}.txt" 2>&1
    echo "suite under triton $v: rc $?, $(( $(date +%s) - start )) s"
    grep -E "FAILED|ERROR" "$OUT/suite_triton$v${ROUND:-}.txt" | head -30
    tail -4 "$OUT/suite_triton$v${ROUND:-}.txt"
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo "done after $(( $(date +%s) - start )) s"
