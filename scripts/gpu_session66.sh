#!/usr/bin/env bash
# The GPU calls of session 66 (H200). Session 65 left in main the window forward in Gluon
# (nsa/ops/window/gluon_fwd.py, NSA_GLUON_WINDOW_FWD, off) in a form whose own tests had not run, and
# two branches compiled offline, never run, both rebased on main this session: the window dK/dV made
# persistent (next/gluon-window-dkdv-persistent) and the window dQ with the next tile's S and dP issued
# before this tile's dS (next/gluon-window-dq-early-s). Their files are exported to .variants66/
# (untracked, deleted after the calls):
#   git show next/gluon-window-dkdv-persistent:src/nsa/ops/window/gluon_dkdv.py > .variants66/persistent_dkdv.py
#   git show next/gluon-window-dq-early-s:src/nsa/ops/window/gluon_dq.py > .variants66/early_s_dq.py
#
#   bash scripts/gpu_session66.sh probes      # NSA_GLUON_WINDOW_FWD off and on at 64k and 8k (ABBA
#                                             # forward and forward+backward, kernel lists); each
#                                             # branch's kernel against main's (gradients, ABBA, lists)
#
# The Gluon window forward 4.16-4.17 ms at 64k against the Triton kernel's 4.47-4.51 (1.08x), 0.506-0.508
# against 0.546-0.557 at 8k; the 64k forward 31.41-31.88 against 31.62-32.17 ms (ABBA). Both branches'
# gradients equal main's bit for bit, both slower: the persistent dK/dV 6.44-6.48 against 5.98-6.00 ms
# at 64k, the early-S dQ 5.37-5.38 against 4.42-4.43 (it spills). NSA_GLUON_WINDOW_FWD on by default:
#
#   bash scripts/gpu_session66.sh tables      # the GPU tests of the ops, the layer and varlen with the
#                                             # library's defaults; nsa-bench prefill (8k-64k) and
#                                             # decode (batch 1-64)
#
# The tests ran past their 380 s at about 98 %, none failed. At c2b923b: prefill 64k 31.16 / 115.8 ms
# (3.72x) forward, 85.67 / 441.4 (5.15x) forward+backward; 8k 0.79x and 1.21x. Decode at 64k 19.04 /
# 49.39 us (2.59x) at batch 1, 71.86 / 493.2 (6.86x) at batch 16. The tests again, alone:
#
#   bash scripts/gpu_session66.sh suite       # the same GPU tests alone, each test's outcome on its
#                                             # own line, under a longer limit
#
# 447 passed, 18 skipped in 335 s. The H200 baseline's prefill points were session 35's kernels (64k
# forward+backward 96.9 ms), its decode points session 50's:
#
#   bash scripts/gpu_session66.sh baseline    # every point of the pytest-benchmark baseline saved again,
#                                             # prefill then decode (the JSON copied to $OUT)
#
# Prefill points as the tables' (64k forward+backward 86.17 / 448.1 ms). The decode points' graph
# replays at batch 1 spread widely: 19.1-145 us at 64k, median 33.7 (the CLI's 19.0), 15.2-97.9 at 16k,
# median 24.0: the host stalled past the flush before submitting them. A replay now waits behind a
# 0.5 ms device spin as well (nsa.bench.timing.HOST_SLACK_S):
#
#   bash scripts/gpu_session66.sh timing      # the timing GPU tests; the decode points saved again;
#                                             # the CLI's decode table at batch 1 and 16
#
# The decode points' replays now spread as the CLI's: batch 1 at 64k 18.8-20.0 us (median 19.3), at 16k
# 15.3-16.2; every graph point's max within 1.1x of its min. The CLI's batch 1 at 64k 18.96 us, batch 16
# 71.25 (6.92x). Three timing tests failed: the rate's test calibrated under its own _sleep stub
# (fixed: calibrated first):
#
#   bash scripts/gpu_session66.sh retest      # the timing GPU tests again
source "$(dirname "$0")/gpu_env.sh"
step="${1:?usage: gpu_session66.sh STEP}"

device_line
case "$step" in
probes)
    probe_run 150 gluon_window_fwd --lengths 65536 8192 --only gluon_window_fwd
    probe_run 210 persistent_dkdv --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch window \
        --dkdv-variant persistent=.variants66/persistent_dkdv.py
    probe_run 210 early_s_dq --lengths 65536 8192 --only gluon_dkdv_variants --dkdv-branch window \
        --variant-module gluon_dq --dkdv-variant early_s=.variants66/early_s_dq.py
    ;;
tables)
    worker_tests 380 "$(git rev-parse --short HEAD 2>/dev/null || echo session66)" tests/ops tests/test_module.py \
        tests/test_varlen.py
    tar_reports
    h200_prefill
    echo "== prefill table after $(( $(date +%s) - start )) s"
    decode_table h200
    ;;
suite)
    verbose_tests 560 "$(git rev-parse --short HEAD 2>/dev/null || echo session66)" suite tests/ops \
        tests/test_module.py tests/test_varlen.py
    tar_reports
    ;;
baseline)
    save_baseline h200 280 prefill decode
    ;;
timing)
    timeout 120 python -m pytest tests/bench -p no:cacheprovider --gpu-profile auto -q -rs 2>&1 | tail -4
    timeout 150 python -m pytest tests/benchmarks -k decode --gpu-profile h200 --nsa-baseline=save \
        -p no:cacheprovider -q > "$OUT/baseline_decode.log" 2>&1
    echo "== baseline decode: rc $? after $(( $(date +%s) - start )) s"
    tail -4 "$OUT/baseline_decode.log"
    cp gpu_profiles/baselines/h200/benchmarks.json "$OUT/"
    timeout 120 python -m nsa.bench decode --profile h200 --batch 1,16 --graph --budget 4 \
        --csv "$OUT/decode_h200_b1_b16.csv" 2>&1 | tail -12
    ;;
retest)
    timeout 120 python -m pytest tests/bench -p no:cacheprovider --gpu-profile auto -q -rs > "$OUT/timing_tests.txt" 2>&1
    echo "== tests: rc $? after $(( $(date +%s) - start )) s"
    tail -6 "$OUT/timing_tests.txt"
    ;;
*)
    echo "unknown step $step"; exit 2
    ;;
esac
echo "== done after $(( $(date +%s) - start )) s"
