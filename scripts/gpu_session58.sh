#!/usr/bin/env bash
# The GPU calls of session 58 (H200). A decode step's batch-16 compressed pass (launch 1) reads the
# compressed keys and values, 134 MB at 64k, in one wave at about 3.5 TB/s, and the score launch
# after it moves few bytes for its 8 us. Scoring needs only the keys. With values_apart (new, off)
# launch 1 reads the keys alone and leaves each tile's softmax weights (8.4 MB in bf16), and a values
# launch on a stream of its own, forked after launch 1 and joined before the combine, builds the
# compressed splits' accumulators from them and the values while the score and selected launches run
# (bitwise launch 1's own):
#
#   bash scripts/gpu_session58.sh apart REV   # the values_apart GPU tests (eager and graph, bitwise);
#                                             # the step both ways, ABBA twice, at batch 16-64, 64k,
#                                             # and batch 16 at 8k, 32k, batch 1 at 64k, with dense;
#                                             # each kernel's time; the timeline of a batch-16 replay
#                                             # (ran at f395409; that tree's option, kernel, tests and
#                                             # scripts/gpu_values_apart.py are in
#                                             # docs/perf/attempts/decode_values_apart.patch)
#
# Bitwise the same, and slower everywhere it applies: batch 16 at 64k 87.74 us against 72.42 (ABBA
# twice), batch 32 150.4 against 124.0, batch 64 296.5 against 230.3, batch 16 at 8k 40.7 against
# 38.6 and at 32k 60.0 against 52.8 (batch 1 unchanged, 20.5). Launch 1 without the values took
# 31.8 us eager against 38.8 with them: half the bytes, 18 % less time. The values launch alone took
# 22.2 us, and in a replay it started 6.3 us after launch 1 ended and took 38.6 us beside the
# selected launch; the combine waited for it (83.8 us against 69.0 from first start to last end).
# Dropped.
#
#   bash scripts/gpu_session58.sh final REV   # nsa-bench prefill (8k-64k) and decode (batch 1-64) at
#                                             # main's kernels (unchanged since session 57), and the
#                                             # decode kernels' GPU tests (report named after REV)
#                                             # (ran at b3c9a90)
#
# Prefill 64k 33.14 / 118.4 ms (3.57x) forward, 97.34 / 453.8 (4.66x) forward+backward, 8k 0.90x and
# 1.06x; decode at 64k 18.96 / 50.05 us (2.64x) at batch 1, 71.39 / 493.1 (6.91x) at batch 16; the
# decode GPU tests, 103 passed.
#
#   bash scripts/gpu_session58.sh stalls      # Nsight Compute's stall counters (warp cycles per issued
#                                             # instruction by reason, scripts/ncu_stalls.py) of the
#                                             # decode step at 64k (batch 16 and 1, PDL off), the 8k
#                                             # prefill forward, the 16k forward+backward, and the
#                                             # compressed dK/dV at 16k with and without its dS stores
#                                             # (ran at b717935)
#
# The batch-16 compressed pass waits most on the short scoreboard (2.51 of 8.05 cycles an issued
# instruction); the selected kernels on their loads (long scoreboard, 41-47 %); the window forward
# issues every 4.7 cycles; the compressed dK/dV's dS stores add 0.44 cycles of long scoreboard, 0.13
# of short scoreboard and 0.11 of LSU throttle to its 6.17 (docs/perf/decode.md, prefill.md).
#   bash scripts/gpu_session58.sh desc REV    # the compressed dK/dV's query tiles (q, do, lse, delta,
#                                             # gates) by bulk copies through tensor descriptors
#                                             # (compressed.kernel.DKDV_LOADS, new, off) against plain
#                                             # loads: probe section dkdv_desc at 64k and 16k; the
#                                             # compressed GPU tests (report named after REV)
#                                             # (ran at aca1237; the option, its tests and the probe
#                                             # section are in docs/perf/attempts/
#                                             # prefill_compressed_dkdv_descriptors.patch)
#
# Bitwise the same (and 34 compressed GPU tests passed), but slower: the dK/dV kernel 22.77 against
# 22.02 ms at 64k and 1.72 against 1.66 at 16k; the compressed backward 27.57-27.75 against
# 26.93-27.29 ms (ABBA); the whole 64k forward+backward 95.53-95.71 against 94.31-95.36. Compiled for
# sm_90 the loop lost 43 of its 629 instructions but spills 9-23 a step (255 registers, 136 bytes of
# stack), and keeps its 10 barriers a step. Dropped.
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session58.sh apart REV | final REV | stalls | desc REV}"
device_line

case "$step" in
apart)
    rev="${2:?the apart step needs the commit to name the test report after}"
    timeout 240 python -m pytest -q -x tests/ops/test_decode_kernel.py -k "values_apart" --gpu-profile auto \
        -p no:cacheprovider 2>&1 | tail -4
    echo "== tests after $(( $(date +%s) - start )) s ($rev)"
    timeout 300 python scripts/gpu_values_apart.py --dense 2>&1 | tee "$OUT/decode_values_apart_h200.md"
    echo "== A/B after $(( $(date +%s) - start )) s"
    timeout 90 python scripts/gpu_decode_timeline.py --contexts 65536 --batches 16 --replays 5 \
        --variants '{"values_apart": false}' '{"values_apart": true}' 2>&1 | tee "$OUT/decode_values_apart_timeline_h200.md" | tail -40
    ;;
final)
    rev="${2:?the final step needs the commit to name the test report after}"
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    reported_tests 200 "$rev" tests/ops/test_decode_kernel.py tests/test_decode_graph.py
    ;;
stalls)
    metrics='regex:^(gpu__time_duration\.sum|smsp__inst_executed\.sum|smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio)$'
    ncu_raw() {  # ncu_raw NAME [NCU-ARG...] -- COMMAND...: $OUT/ncu_stalls_NAME.csv
        local name="$1" args=()
        shift
        while [ "$1" != "--" ]; do args+=("$1"); shift; done
        shift
        timeout 150 ncu --profile-from-start off --clock-control none --metrics "$metrics" -f -o "/tmp/ncu_$name" \
            "${args[@]}" "$@" >> "$OUT/ncu_stalls.log" 2>&1
        echo "== ncu $name: rc $? after $(( $(date +%s) - start )) s"
        ncu -i "/tmp/ncu_$name.ncu-rep" --csv --page raw > "$OUT/ncu_stalls_$name.csv" 2>> "$OUT/ncu_stalls.log"
    }
    ncu_raw decode_b16_64k -- python scripts/ncu_decode.py --cases 16:65536
    ncu_raw decode_b1_64k -- python scripts/ncu_decode.py --cases 1:65536
    ncu_raw prefill_fwd_8k -- python scripts/ncu_prefill.py --length 8192
    ncu_raw prefill_fwdbwd_16k -- python scripts/ncu_prefill.py --length 16384 --backward
    for ds in on off; do
        ncu_raw "cmp_dkdv_16k_ds_$ds" -k regex:compressed_bwd_dkdv_kernel -- \
            python scripts/ncu_compressed_bwd.py --length 16384 --ds "$ds"
    done
    python scripts/ncu_stalls.py "$OUT"/ncu_stalls_*.csv | tee "$OUT/ncu_stalls_h200.md"
    (cd "$OUT" && tar -cf ncu_stalls_csv.tar ncu_stalls_*.csv && rm ncu_stalls_*.csv)
    ;;
desc)
    rev="${2:?the desc step needs the commit to name the test report after}"
    probe_run 420 dkdv_desc --lengths 65536 16384 --only dkdv_desc --kernels 8
    reported_tests 150 "$rev" tests/ops/test_compressed_kernel.py
    ;;
*)
    echo "unknown step $step"
    exit 2
    ;;
esac
