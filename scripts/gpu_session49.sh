#!/usr/bin/env bash
# The GPU calls of session 49 (H200). Session 48 left the batch-16 step at 64k with the compressed
# pass ending 45.9 us in, the score launch 8.0 us later, the selected 14.1 and the combine 2.5
# (the launches' spans). What inside the score and selected programs takes that time?
#
#   bash scripts/gpu_session49.sh trace      # every program's %globaltimer stamps (gpu_decode_trace.py) at
#                                            # 64k, batch 1, 16 and 32, and batch 16 with score tiles of 64
#                                            # blocks
#   bash scripts/gpu_session49.sh placement  # the same stamps at batch 16 and 32, 64k, with each launch's
#                                            # programs by how many shared their SM, and the compressed
#                                            # pass's last programs
#   bash scripts/gpu_session49.sh late       # (needs attempts/decode_score_late.patch, dropped, applied) the score
#                                            # launch's programs placed late: the compressed programs let it
#                                            # start as they end (score_late), or no PDL for it; stamps
#                                            # at batch 16, 64k, then variant rounds at batch 1, 16 and 32
#   bash scripts/gpu_session49.sh forced REV # the selection programs attend their forced blocks before the
#                                            # wait for the scores (forced_early, on by default with the
#                                            # descriptors): the decode kernels' GPU tests (report named after
#                                            # REV, as one tar); variant rounds against forced_early off, and
#                                            # with score_late (then in main), at batch 16 and 32; stamps at
#                                            # batch 16, 64k
#   bash scripts/gpu_session49.sh ab         # (needs ab_base/src, git archive of 1bf352a, and ab_masked/src:
#                                            # this tree with the selected blocks' loop over every slot, unused
#                                            # ones masked, as before) the three trees in turn, three times, at
#                                            # batch 1, 16 and 32; score_late (then in main) at batch 32 (8k)
#                                            # and 64 (64k)
#   bash scripts/gpu_session49.sh tiles REV  # (needs ab_base/src and attempts/decode_score_tiles_per_program.patch,
#                                            # dropped, applied) each score program takes several tiles of its
#                                            # row once the launch would hold more than 4 programs an SM
#                                            # (score_tiles_per_program; 4 at batch 16, 64k): the decode kernels'
#                                            # GPU tests (report named after REV, as one tar); ab_base/src and
#                                            # this tree in turn, three times, at batch 1-64; one tile a program
#                                            # as a variant at batch 16 and 32; stamps at batch 16, 64k
#   bash scripts/gpu_session49.sh merge REV  # (needs ab_base/src, git archive of b8c3e7e) the selection programs'
#                                            # merge pairing the runs half the runs apart first (3400 SASS
#                                            # instructions a batch-16 selection program against 3592): the
#                                            # decode kernels' top-n, score and launch tests on the GPU (report
#                                            # named after REV, as one tar); the two trees in turn, three times
#   bash scripts/gpu_session49.sh final REV  # the decode table at batch 1-64 and the baseline's decode points;
#                                            # the layer's, cache's, captured step's and packed batches' GPU
#                                            # tests (report named after REV, as one tar)
#
# Everything it prints or writes goes to $OUT (the device tool brings that folder back).
here="$(dirname "$0")"
. "$here/gpu_env.sh"

step="${1:?usage: scripts/gpu_session49.sh trace | placement | late | forced REV | ab | tiles REV | merge REV | final REV}"
device_line
case "$step" in
trace)
    timeout 400 python scripts/gpu_decode_trace.py --contexts 65536 --batches 1 16 32 --replays 5 2>&1 \
        | tee "$OUT/decode_trace_h200.md" | tail -80
    timeout 150 python scripts/gpu_decode_trace.py --contexts 65536 --batches 16 --replays 5 \
        --variants '{"score_blocks": 64}' '{"score_blocks": 64, "score_warps": 2}' 2>&1 \
        | tee "$OUT/decode_trace_score64_h200.md" | tail -60
    ;;
placement)
    timeout 300 python scripts/gpu_decode_trace.py --contexts 65536 --batches 16 32 --replays 5 2>&1 \
        | tee "$OUT/decode_trace_placement_h200.md" | tail -90
    ;;
late)
    late=('{"score_late": true}' '{"pdl": [false, true, true]}')
    timeout 200 python scripts/gpu_decode_trace.py --contexts 65536 --batches 16 --replays 5 --variants '{}' \
        "${late[@]}" 2>&1 | tee "$OUT/decode_trace_late_h200.md" | grep -E "^B=|^  [a-z]|end:|wait over:|by the launch"
    variant_rounds late_b16 16 65536 "8192 65536" 150 "${late[@]}"
    variant_rounds late_b32 32 65536 "65536" 120 "${late[@]}"
    variant_rounds late_b1 1 65536 "8192 65536" 120 "${late[@]}"
    ;;
forced)
    gpu_tests "${2:?forced needs the commit to name the report after}" tests/ops/test_decode_kernel.py
    tar_reports
    forced=('{"forced_early": false}' '{"score_late": true}' '{"forced_early": false, "score_late": true}')
    variant_rounds forced_b16 16 65536 "8192 65536" 200 "${forced[@]}"
    variant_rounds forced_b32 32 65536 "65536" 150 "${forced[@]}"
    timeout 150 python scripts/gpu_decode_trace.py --contexts 65536 --batches 16 --replays 5 --variants '{}' \
        "${forced[@]}" 2>&1 | tee "$OUT/decode_trace_forced_h200.md" | grep -E "^B=|^  [a-z]|end:|wait over:|before|top-n"
    ;;
ab)
    AB_POINTS="1:65536 16:8192 16:65536 32:65536" ab_rounds forced_ab 3 120 base masked new
    variant_rounds late_b64 64 65536 "65536" 150 '{"score_late": true}'
    variant_rounds late_b32_8k 32 8192 "8192 32768" 150 '{"score_late": true}'
    ;;
tiles)
    gpu_tests "${2:?tiles needs the commit to name the report after}" tests/ops/test_decode_kernel.py
    tar_reports
    AB_POINTS="1:65536 16:8192 16:32768 16:65536 32:65536 64:65536" ab_rounds tiles_ab 3 150 base new
    variant_rounds tpp1_b16 16 65536 "32768 65536" 150 '{"score_tiles_per_program": 1}'
    timeout 100 python scripts/gpu_decode_trace.py --contexts 65536 --batches 16 --replays 5 2>&1 \
        | tee "$OUT/decode_trace_tiles_h200.md" | grep -E "^B=|^  [a-z]|end:|wait over:|by the launch"
    ;;
merge)
    gpu_tests "${2:?merge needs the commit to name the report after}" tests/ops/test_decode_kernel.py \
        -k "sorted_runs or bitonic or topn or keys_hold or variants or real_size"
    tar_reports
    AB_POINTS="1:65536 16:32768 16:65536 32:65536" ab_rounds merge_ab 3 60 base new
    ;;
final)
    decode_table_and_baseline h200
    gpu_tests "${2:?final needs the commit to name the report after}" tests/test_module.py tests/test_cache.py \
        tests/test_decode_graph.py tests/test_varlen.py
    tar_reports
    ;;
*) echo "unknown step $step" >&2; exit 2 ;;
esac
