#!/bin/bash
# The GPU calls of session 21 (docs/perf/decode.md, "Session 21"):
#
#   bash scripts/gpu_session21.sh decode <rev>  # the selected programs' top-n as one bitonic top-k
#                                               # against rounds: correctness and graph timings
#                                               # (8k, 64k; B = 1, 16; gpu_decode.py variants), each
#                                               # kernel's span in a batch-1 replay, then the decode
#                                               # GPU tests, the report named after <rev>
#                                               # (CONTEXTS and AGAINST change what it times)
#   bash scripts/gpu_session21.sh sweep         # batch-1 launch variants with the bitonic top-n
#   bash scripts/gpu_session21.sh l2            # the rate at which L2 delivers random K/V blocks
#                                               # (gpu_l2_ceiling.py), beside every kernel of one
#                                               # 8k and one 64k forward+backward
#   bash scripts/gpu_session21.sh l2more        # the same rate with 8 to 32 programs an SM
#   PART=ops1|ops2|rest bash scripts/gpu_session21.sh suite <rev>  # half the kernel tests each /
#                                               # every other test but the benchmarks, on the GPU
#   bash scripts/gpu_session21.sh table         # the decode table (PROFILE=h100 or h200) and the
#                                               # decode points of the pytest baseline
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
. "$(dirname "$0")/gpu_env.sh"
case "${1:?usage: scripts/gpu_session21.sh decode REV|sweep|l2|l2more|suite REV|table}" in
decode)
    # CONTEXTS: the contexts timed (8k and 64k are checked); AGAINST: the launch that each kernel's
    # span in a replay is compared with, in turn with the default (session 22 sets both)
    AGAINST="${AGAINST:-{\"topn_bitonic\": false\}}"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    # shellcheck disable=SC2086  # CONTEXTS is a list
    python scripts/gpu_decode.py --contexts ${CONTEXTS:-8192 65536} --check-contexts 8192 65536 --batches 1 16 \
        --variants 8192 65536 --check-variants --out "$OUT/decode_variants.md" > "$OUT/decode_variants.log" 2>&1
    tail -45 "$OUT/decode_variants.md"
    python scripts/gpu_decode_timeline.py --batches 1 --contexts 8192 65536 \
        --variants '{}' "$AGAINST" '{}' "$AGAINST" 2>&1 | tee "$OUT/decode_timeline.txt"
    decode_gpu_tests "${2:-}"
    ;;
sweep)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_decode.py --contexts 8192 65536 --batches 1 --variants 8192 65536 \
        --out "$OUT/decode_sweep.md" > "$OUT/decode_sweep.log" 2>&1
    grep -A30 "Launch variants" "$OUT/decode_sweep.md"
    ;;
l2)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
    python scripts/gpu_l2_ceiling.py --length 8192 2>&1 | tee "$OUT/l2_ceiling.txt"
    python scripts/gpu_prefill_probe.py --only kernels --kernels 24 --lengths 8192 65536 2>&1 | tee "$OUT/kernels.txt"
    ;;
l2more)
    # more programs per SM, where the first sweep's best (8 an SM) was still rising
    python scripts/gpu_l2_ceiling.py --length 8192 --per-sm 8 16 32 --warps 1 2 --stages 2 4 2>&1 | tee "$OUT/l2_ceiling_more.txt"
    ;;
suite)
    # the suite on the GPU in parts: all of it ran past 570 s at about 88 %, and tests/ops alone
    # past 560 s at about 87 % (3 workers, H100), and a timeout leaves no report. PART=ops1 and ops2
    # split the kernel tests, PART=rest is everything else. Session 22 (H100, 3 workers): the
    # compressed, selection and whole-op files took 516 s (1141 s of tests: whole op 519, compressed
    # 350, selection 272), the other kernel files 179 s (432 s), the rest 266 s (626 s); so the
    # compressed file now goes with the other kernel files, about 790 s of tests in each part
    case "${PART:-ops1}" in
    ops1) WHICH=(tests/ops/test_select_kernel.py tests/ops/test_nsa_attention_kernel.py) ;;
    ops2) WHICH=(tests/ops --ignore=tests/ops/test_select_kernel.py --ignore=tests/ops/test_nsa_attention_kernel.py) ;;
    *) WHICH=(tests --ignore=tests/ops) ;;
    esac
    timeout 560 python -m pytest -q -n 3 --dist worksteal -m "not benchmark" --gpu-profile auto --nsa-report "$OUT" \
        --nsa-report-commit "${2:?suite needs the commit to name the report after}" "${WHICH[@]}" 2>&1 | tail -8
    ;;
table)
    P="${PROFILE:-h100}"
    python -m pytest tests/benchmarks -k decode --gpu-profile "$P" --nsa-baseline=save -p no:cacheprovider -q 2>&1 \
        | tail -5 | tee "$OUT/pytest_baseline.txt"
    cp "gpu_profiles/baselines/$P/benchmarks.json" "$OUT/benchmarks_$P.json"
    python -m nsa.bench decode --profile "$P" --batch 1,16 --graph --budget 4 --csv "$OUT/decode_$P.csv" \
        --plot "$OUT/decode_$P.png" 2>&1 | tail -16
    ;;
*)
    echo "unknown step $1" >&2
    exit 2
    ;;
esac
