#!/usr/bin/env bash
# The GPU calls of session 73 (H200). The selected forward is one warp a program, 6 programs an SM
# (shared memory: 2 stages of a block; 255 registers allow 8); at 8k it issues about one instruction a
# cycle an SM, each warp waiting on its chain's latency (session 72). Here: more programs an SM,
# through one stage and a cap on the registers (scripts/gpu_prefill_probe.py, section sel_regs); the
# forward's L2 bytes; and in decode, the score programs' order (a hand-off in the order the compressed
# pass finishes its row-groups, dropped) and their placement (at most 20 an SM, kept).
#
#   bash scripts/gpu_session73.sh regs        # the selected forward by stages and registers at 8k and
#                                             # 64k, bitwise against the default; the fastest in the
#                                             # whole forward (ABBA) where it wins
#
# 8k / 64k ms, two rounds, every output bitwise the default's: 2 stages, 6 programs an SM (the default)
# 1.240-1.264 / 12.07-12.14; 1 stage (8) 1.286-1.297 / 12.36-12.37; 1 stage at 192 registers (10)
# 1.429-1.446 / 12.89-12.91; at 168 (10) 1.82 / 16.69. The defaults hold; no ABBA ran.
#
#   bash scripts/gpu_session73.sh l2          # Nsight Compute: each kernel of one prefill forward (8k,
#                                             # 64k), NSA and dense SDPA (cuDNN): time, L2 and DRAM
#                                             # bytes, L2 and SM throughput against peak, L2 hit rate
#
# The selected forward at 87.6 % (8k) and 89.1 % (64k) of the L2's peak, 11.7 and 116.6 GB; NSA's
# kernels 2.108 / 28.72 ms against dense's 1.713 / 109.1 (the NSA 8k CSV did not come back: too many
# files; its table did).
#
# The steps handoff, handoff2 and trace need docs/perf/attempts/decode_score_handoff_dynamic.patch
# applied (decode_fwd's score_handoff; measured and dropped).
#
#   bash scripts/gpu_session73.sh handoff     # decode: the score programs take the row-groups in the
#                                             # order the compressed pass finishes them
#                                             # (score_handoff), against the default, batch 16, 32 and
#                                             # 64 at 8k and 64k, each checked against the reference
#
# Correct (the default's error and blocks), slower: batch 16 at 64k 78.0-78.2 against 72.1-72.3 us, at
# 8k 39.4-39.5 against 38.1; batch 32 128.0-128.2 against 123.2-123.6; batch 64 249.6-250.1 against
# 227.2-227.4.
#
#   bash scripts/gpu_session73.sh handoff2    # the same at batch 16 and 32, the score programs polling
#                                             # by plain loads with a 256-ns pause, then one acquire
#
# Batch 16 at 64k 79.1-79.4 against 72.6; batch 32 129.7-130.2 against 124.9-125.3: the polls were not
# what cost.
#
#   bash scripts/gpu_session73.sh trace       # each program's stamps (scripts/gpu_decode_trace.py),
#                                             # batch 16 at 64k, without and with score_handoff
#
# With it the compressed pass's last program ended at 48.4 us against 45.2, and the score programs
# started their tiles at a median 49.9 us against 44.9; the combine ended at 73.3 against 67.4.
#
#   bash scripts/gpu_session73.sh cap         # decode at batch 16: the score programs capped at
#                                             # ceil(programs / SMs) an SM by a static shared-memory
#                                             # array (score_cap), and in two warps, against the default
#
# The first call failed to compile at 8k (256 programs: a 115-KiB static array, past 48 KiB); then
# batch 16 at 64k 71.5-71.6 against 72.0-72.1, two warps 73.2-73.3; 8k 38.5-38.6 against 37.8-39.0.
#
#   bash scripts/gpu_session73.sh caps        # the cap at 12, 16, 20 and 24 programs an SM (64k), and
#                                             # the stamps at 16
#
# 12 an SM 72.6, 16 71.2-71.3, 20 70.9-71.2, 24 71.2-71.3, against 71.8-72.1 us.
#
#   bash scripts/gpu_session73.sh capped      # with the cap on by default (20 score programs an SM once
#                                             # the batch fills the GPU): the decode GPU tests, then the
#                                             # default against score_cap 0 at batch 16 and 32
#
# The tests: 105 of 106 passed (the new cap test's 8k launch with a 48-KiB array invalid; the array
# now stops at 46 KiB). Batch 16 at 64k 71.5-71.7 capped against 72.9-73.1; 32k 53.3-53.4 against
# 52.8-52.9; 16k 44.5-44.7 against 44.4-44.5; 8k 40.0-40.1 against 38.2-38.4; batch 32 at 32k
# 83.4-83.5 against 82.1-82.5, at 8k 55.0-55.4 against 53.5-53.6.
#
#   bash scripts/gpu_session73.sh table       # the cap's GPU test, then the decode table (batch 1, 16,
#                                             # 32, 64), the cap from 12 programs an SM on
#
# Run at d3bb137 (the first rule) and at f48def7 (the rule as kept): batch 16 at 64k 70.10 / 494.5 us
# (7.05x) and 69.92 / 502.8 (7.19x); batch 1 at 64k 18.98 / 49.34 (2.60x) and 19.01 / 49.76 (2.62x).
#
#   bash scripts/gpu_session73.sh final       # the decode GPU tests at the session's last code
#
# At c669145: 142 passed (docs/perf/raw/session73_gpu_tests_decode_c669145_h200.txt).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
device_line
step="${1:-}"

case "$step" in
regs)
    probe_run 400 sel_regs --only sel_regs --lengths 8192 65536
    ;;
l2)
    M=gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum
    M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
    M=$M,lts__t_sector_hit_rate.pct
    for T in 8192 65536; do
        for who in nsa dense; do
            impl=$([ $who = dense ] && echo dense_cudnn || echo nsa)
            timeout 200 ncu --profile-from-start off --clock-control none --metrics "$M" --csv --page raw \
                python scripts/ncu_prefill.py --length $T --impl $impl > "$OUT/l2bytes_${who}_$T.csv" \
                2> "$OUT/l2bytes_${who}_$T.err"
            echo "== $who $T: rc $? after $(( $(date +%s) - start )) s"
            tail -3 "$OUT/l2bytes_${who}_$T.err"
        done
    done
    python scripts/ncu_bytes.py "$OUT"/l2bytes_*.csv | tee "$OUT/l2bytes.md"
    ;;
handoff)
    for batch in 16 32 64; do
        variant_rounds "handoff_b$batch" "$batch" 65536 "8192 65536" 200 '{"score_handoff": true}'
    done
    ;;
handoff2)
    for batch in 16 32; do
        variant_rounds "handoff2_b$batch" "$batch" 65536 "8192 65536" 200 '{"score_handoff": true}'
    done
    ;;
trace)
    timeout 300 python scripts/gpu_decode_trace.py --contexts 65536 --batches 16 --replays 5 \
        --variants '{}' '{"score_handoff": true}' 2>&1 | tee "$OUT/decode_trace_handoff_h200.md"
    ;;
cap)
    variant_rounds cap_b16 16 65536 "8192 65536" 300 '{"score_cap": true}' '{"score_warps": 2}'
    ;;
caps)
    variant_rounds caps_b16 16 65536 "65536" 300 '{"score_cap": 12}' '{"score_cap": 16}' '{"score_cap": 20}' \
        '{"score_cap": 24}'
    timeout 300 python scripts/gpu_decode_trace.py --contexts 65536 --batches 16 --replays 5 \
        --variants '{}' '{"score_cap": 16}' 2>&1 | tee "$OUT/decode_trace_cap_h200.md"
    ;;
capped)
    run_group decode 260 3 tests/ops/test_decode_kernel.py tests/test_decode_graph.py
    variant_rounds capped_b16 16 65536 "8192 16384 32768 65536" 200 '{"score_cap": 0}'
    variant_rounds capped_b32 32 65536 "8192 32768" 150 '{"score_cap": 0}'
    ;;
table)
    run_group cap 120 1 tests/ops/test_decode_kernel.py -k score_cap
    decode_table h200
    ;;
final)
    run_group decode 300 3 tests/ops/test_decode_kernel.py tests/test_decode_graph.py tests/test_cache.py
    ;;
*)
    echo "usage: bash scripts/gpu_session73.sh regs|l2|handoff|handoff2|trace|cap|caps|capped|table|final" >&2
    exit 2
    ;;
esac
echo "elapsed $(( $(date +%s) - start )) s"
