#!/usr/bin/env bash
# SASS of the decode op's score, selection, compressed and combine kernels (sm_90a), compiled
# without a GPU with the launches' own parameters at 64k, HQ 64, H 4, D 128 and the paper's
# defaults, at batch 1 or at batch 16 (where the batch fills an H100/H200: block masses, one-warp
# score programs, bulk copies, the window's programs in the selection launch). Prints each loop's
# and the whole kernel's instruction counts and the source lines with the most instructions
# (scripts/sass_loops.py --by-line). The counts in docs/perf/decode.md (sessions 43, 44 and 46)
# are from these.
#
#   bash scripts/sass_decode.sh score|selected|cmp|combine b1|b16 [NAME=VALUE ...]
#
# NAME=VALUE pairs override a parameter (e.g. num_warps=2). Use the GPU machine's Triton:
#   pip install --no-deps --target /tmp/t36 triton==3.6.0; TRITON_PATH=/tmp/t36 (the default)
# Writes /tmp/sass_decode_KERNEL_BATCH.{ttgir,ptx,cubin,sass}.
set -euo pipefail
kernel="${1:?usage: scripts/sass_decode.sh score|selected|cmp|combine b1|b16 [NAME=VALUE ...]}"
batch="${2:?usage: scripts/sass_decode.sh score|selected|cmp|combine b1|b16 [NAME=VALUE ...]}"
shift 2
cd "$(dirname "$0")/.."
case "$batch" in
b1) fills=False ;;
b16) fills=True ;;
*) echo "batch: b1 or b16, got $batch" >&2; exit 2 ;;
esac
strides() { for s in "$@"; do printf '%s=i64/16 ' "$s"; done; }
case "$kernel" in
score)
    # without the cap on programs an SM that batch 16 at 64k takes (CAP_ASM: a PTX block with spaces;
    # pass "CAP_ASM=$(python -c '...reserve_shared_asm(N)')" to compile it, as the CPU test does)
    if [ "$fills" = True ]; then per_batch="MASS=True BSC=8 num_warps=1"; else per_batch="MASS=False BSC=16 num_warps=4"; fi
    params="seq_lens=*i32 logits=*fp32 m_part=*fp32 l_part=*fp32 cand=*i64 SINK_STRIDE=i32/16 NCAND=i32/16 S_CMP=i32
        S=i32 TQ=1 H=4 G=16 CMP_BLOCK=32 CMP_STRIDE=16 SEL_BLOCK=64 N=16 NP=16 INIT=1 LOCAL=2 BG=16 BJ=32 NCOVER=5
        PDL=True CONTIG=True R=4 DROP=evict_first CMP_TILE=32 SORTED=True FAST_LOG2=True RUN_BIT=4 CAP_ASM=None
        $per_batch num_stages=3
        enable_fp_fusion=False"
    ;;
selected)
    if [ "$fills" = True ]; then
        per_batch="SB=4 SEL_DESC=True WIN=True d_k=tensordesc<bf16[1,64,1,128]> d_v=tensordesc<bf16[1,64,1,128]>
            FORCED_EARLY=True"
    else
        per_batch="SB=1 SEL_DESC=False WIN=False d_k=*bf16 d_v=*bf16 FORCED_EARLY=False"
    fi
    params="q=*bf16 k=*bf16 v=*bf16 seq_lens=*i32 cand=*i64 block_idx=*i32 k_win=*bf16 v_win=*bf16 o_part=*fp32
        m_part=*fp32 l_part=*fp32 $(strides s_qr s_qh s_kb s_kt s_kh s_vb s_vt s_vh s_kwb s_kwt s_kwh s_vwb s_vwt s_vwh)
        qk_scale=fp32 NCAND=i32/16 SLOT0=i32 S=i32 S_SLC=i32 S_WIN=i32 WIN_SLOT0=i32/16 TQ=1 H=4 G=16 K=128 V=128
        SEL_BLOCK=64 N=16 NP=16 BJ=32 BG=16 BK=128 BV=128 BC=64 TJ=512 ONE_TILE=True PREC=tf32 PDL=True PER_ROUND=4
        SMALL_TILE=16 WINDOW=512 WIN_TILE=64 KEEP=evict_last RANKED=False BITONIC=True LATE_TRIGGER=True INIT=1 LOCAL=2
        $per_batch num_warps=4 num_stages=3"
    ;;
cmp)
    if [ "$fills" = True ]; then
        per_batch="k_cmp=tensordesc<bf16[1,32,1,128]> v_cmp=tensordesc<bf16[1,32,1,128]> BC=32 CMP_DESC=True MASS=True"
    else
        per_batch="k_cmp=*bf16 v_cmp=*bf16 BC=64 CMP_DESC=False MASS=False"
    fi
    params="q=*bf16 k_win=*bf16 v_win=*bf16 seq_lens=*i32 k_cmp_ptr=*bf16 v_cmp_ptr=*bf16 k_win_ptr=*bf16
        v_win_ptr=*bf16 logits=*fp32 o_part=*fp32 m_part=*fp32 l_part=*fp32
        $(strides s_qr s_qh s_kcb s_kct s_kch s_vcb s_vct s_vch s_kwb s_kwt s_kwh s_vwb s_vwt s_vwh)
        qk_scale=fp32 SINK_STRIDE=i32/16 S_CMP=i32 S_WIN=i32 S=i32 TQ=1 H=4 G=16 K=128 V=128 CMP_BLOCK=32
        CMP_STRIDE=16 WINDOW=512 BG=16 BK=128 BV=128 PREC=tf32 PDL=True WIN_DESC=False KEEP=evict_last SEL_BLOCK=64
        R=4 $per_batch num_warps=4 num_stages=3"
    ;;
combine)
    # batch 1: 16 compressed, 4 window and 16 selected slots, the first two branches merged before
    # the wait, 2 heads a program; batch 16: 6, 2 (the window in the selected launch) and 4, 8 heads
    if [ "$fills" = True ]; then
        per_batch="HB=8 BSC=8 BSXC=8 BSW=2 BSXW=2 BSS=4 BSXS=4 WIN_EARLY=False"
    else
        per_batch="HB=2 BSC=16 BSXC=16 BSW=4 BSXW=4 BSS=16 BSXS=16 WIN_EARLY=True"
    fi
    params="o_part=*fp32 m_part=*fp32 l_part=*fp32 gates=*bf16 o=*bf16 gate_w=*bf16 gate_b=*bf16 S_CMP=i32 S_WIN=i32
        S=i32 HQ=i32 HIDDEN=i32 stride_gx=i32 V=128 BV=128 EARLY=True PDL=True DROP=evict_first GATE_PROJ=False BKG=1
        HAS_BIAS=False $per_batch num_warps=4 num_stages=3"
    ;;
*) echo "kernel: score, selected, cmp or combine, got $kernel" >&2; exit 2 ;;
esac
declare -A target=([score]=score:decode_score_kernel [selected]=selected:decode_selected_fwd_kernel
                   [cmp]=compressed_pass:decode_cmp_win_fwd_kernel [combine]=combine:decode_combine_kernel)
# shellcheck disable=SC2086 # the parameters are separate words; later NAME=VALUE pairs override earlier ones
PYTHONPATH="${TRITON_PATH:-/tmp/t36}:src" "${PYTHON:-python}" scripts/sass_loops.py \
    "nsa.ops.decode.${target[$kernel]}" "/tmp/sass_decode_${kernel}_$batch" $params "$@" --by-line 12
