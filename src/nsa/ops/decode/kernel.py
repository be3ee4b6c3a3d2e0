"""Triton decode: one (or a few) new tokens per sequence over a KV cache, in two launches.

Every program works on one query row (sequence ``b``, new token ``i``) and one KV
group, so each key/value tile it loads serves the group's ``G`` query heads in
one ``tl.dot``. Positions come from the device tensor ``seq_lens``; grids and
buffers depend only on shapes, so a captured CUDA graph replays at any length.

1. ``decode_cmp_win_fwd_kernel``: grid ``(S_CMP + S_WIN, rows * H)``. Split-K
   over the visible compressed tokens (the split size follows the length at run
   time) and over the window; each split writes a partial ``(acc, max, sum)``.
   For every tile of ``BC`` compressed tokens the compressed splits also write
   the tile's block-score partials ``P[g, j] = sum_i exp2(s[g, i] - m_t[g]) * W[i, j]``
   (``W``: the mass-conserving overlap weights, spec Eq. 9) with the tile's
   running max ``m_t``: once the head's log-sum-exp is known, ``exp2(m_t - lse) * P``
   is that tile's share of ``p_slc``, so the probabilities are never stored.
2. ``decode_selected_fwd_kernel``: grid ``(S_SLC, rows * H)``. Every program
   merges the compressed splits into each head's log-sum-exp, sums the tile
   partials into group block scores (Eq. 10), finds the top-n (forced blocks
   first, ties to the lower index: Eq. 11) and attends over its share of the
   selected blocks; it also merges the compressed and window splits of a share of
   the group's heads. The first program writes ``block_idx``; the last one to
   finish (an atomic ticket per row and group) merges the selected partials and
   writes the gated output.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from nsa.config import NSAConfig

LOG2E = 1.4426950408889634
# Block keys pack (score bits, reversed index) into one int64: the bits of a
# non-negative float32 order like the floats, and the reversed index makes the
# lower block win a tie. Forced blocks take the bits of +inf.
KEY_SHIFT = tl.constexpr(4294967296)  # 2**32
KEY_INDEX_MAX = tl.constexpr(4294967295)
INF_BITS = tl.constexpr(0x7F800000)
INT64_MAX = tl.constexpr(9223372036854775807)
@triton.jit
def _row_position(seq_lens, i_r, TQ: tl.constexpr):
    """Sequence index and absolute position of query row ``i_r``."""
    i_b = i_r // TQ
    pos = tl.load(seq_lens + i_b).to(tl.int64) - TQ + i_r % TQ
    return i_b.to(tl.int64), pos


@triton.jit
def _visible_cmp(pos, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr):
    """Spec ``Nc(t)``: compressed tokens whose whole block lies at or before ``pos``."""
    return tl.where(pos + 1 >= CMP_BLOCK, (tl.maximum(pos + 1 - CMP_BLOCK, 0)) // CMP_STRIDE + 1, 0)


@triton.jit
def _load_group_q(q, i_r, i_h, s_qr, s_qh, G: tl.constexpr, K: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr):
    o_g = tl.arange(0, BG)
    o_k = tl.arange(0, BK)
    p_q = q + i_r.to(tl.int64) * s_qr + (i_h * G + o_g[:, None]).to(tl.int64) * s_qh + o_k[None, :]
    return tl.load(p_q, mask=(o_g[:, None] < G) & (o_k[None, :] < K), other=0.0)  # [BG, BK]


@triton.jit
def _attend_range(
    b_q, p_k, p_v, s_kt, s_vt, lo, hi,  #
    b_m, b_l, b_acc, qk_scale,  #
    p_bp, p_bm, s_bh, s_mh,  #
    G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr,  #
    SCORE: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,  #
    JT: tl.constexpr, JTP: tl.constexpr,
):
    """Online softmax of the group's queries over tokens ``[lo, hi)`` (log2 units).

    ``b_m [BG]`` running max, ``b_l [BG]`` running sum, ``b_acc [BG, BV]``. With
    ``SCORE`` (compressed tokens; ``lo`` a multiple of ``BC``) each tile ``t`` also
    writes its block partials ``P [G, JT]`` (head stride ``s_bh``) and max ``m_t [G]``
    (head stride ``s_mh``); tile ``t`` starts at block ``t*BC*d // l'``.
    """
    o_g = tl.arange(0, BG)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_g = o_g < G
    for i0 in range(lo, hi, BC):
        o_t = i0 + tl.arange(0, BC)
        m_t = o_t < hi
        b_k = tl.load(p_k + o_t[:, None].to(tl.int64) * s_kt + o_k[None, :], mask=m_t[:, None] & (o_k[None, :] < K), other=0.0)  # [BC, BK]
        b_v = tl.load(p_v + o_t[:, None].to(tl.int64) * s_vt + o_v[None, :], mask=m_t[:, None] & (o_v[None, :] < V), other=0.0)  # [BC, BV]
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BG, BC]
        b_s = tl.where(m_t[None, :], b_s, float("-inf"))
        # every processed tile holds a visible token, so the new max is finite
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_alpha = tl.exp2(b_m - b_mn)
        b_p = tl.exp2(b_s - b_mn[:, None])  # [BG, BC]
        b_l = b_l * b_alpha + tl.sum(b_p, 1)
        b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC)  # [BG, BV]
        b_m = b_mn
        if SCORE:
            # -- W[i, jj] = |[i*d, i*d + l) ∩ [(j_t + jj)*l', (j_t + jj + 1)*l')| / l --
            i_t = i0 // BC
            o_jj = tl.arange(0, JTP)
            c_lo = o_t[:, None] * CMP_STRIDE
            j_lo = ((i0 * CMP_STRIDE) // SEL_BLOCK + o_jj[None, :]) * SEL_BLOCK
            b_w = tl.maximum(tl.minimum(c_lo + CMP_BLOCK, j_lo + SEL_BLOCK) - tl.maximum(c_lo, j_lo), 0)
            b_pt = tl.dot(b_p, b_w.to(tl.float32) / CMP_BLOCK, input_precision="ieee")  # [BG, JTP]
            p_pt = p_bp + o_g[:, None].to(tl.int64) * s_bh + i_t * JT + o_jj[None, :]
            tl.store(p_pt, b_pt, mask=m_g[:, None] & (o_jj[None, :] < JT))
            tl.store(p_bm + o_g.to(tl.int64) * s_mh + i_t, b_mn, mask=m_g)
    return b_m, b_l, b_acc


@triton.jit
def _store_partial(o_part, m_part, l_part, i_r, i_h, slot, S, b_m, b_l, b_acc,  #
                   HQ: tl.constexpr, G: tl.constexpr, V: tl.constexpr, BG: tl.constexpr, BV: tl.constexpr):
    """Write one split's ``(acc [BG, BV], max [BG], sum [BG])`` for the group's heads."""
    o_g = tl.arange(0, BG)
    o_v = tl.arange(0, BV)
    m_g = o_g < G
    i_rq = (i_r * HQ + i_h * G + o_g).to(tl.int64)  # [BG] global head rows
    tl.store(m_part + i_rq * S + slot, b_m, mask=m_g)
    tl.store(l_part + i_rq * S + slot, b_l, mask=m_g)
    p_o = o_part + (i_rq[:, None] * S + slot) * V + o_v[None, :]
    tl.store(p_o, b_acc, mask=m_g[:, None] & (o_v[None, :] < V))


@triton.jit
def decode_cmp_win_fwd_kernel(
    q, k_cmp, v_cmp, k_win, v_win, seq_lens,  #
    blk_p, blk_m, o_part, m_part, l_part,  #
    s_qr, s_qh,  #
    s_kcb, s_kct, s_kch, s_vcb, s_vct, s_vch,  #
    s_kwb, s_kwt, s_kwh, s_vwb, s_vwt, s_vwh,  #
    qk_scale, NT_CAP, S_CMP, S_WIN, S,  #
    TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr, WINDOW: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, JT: tl.constexpr, JTP: tl.constexpr,  #
    PREC: tl.constexpr,
):
    i_s, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    i_b, pos = _row_position(seq_lens, i_r, TQ)
    b_q = _load_group_q(q, i_r, i_h, s_qr, s_qh, G, K, BG, BK)
    b_m = tl.full([BG], float("-inf"), tl.float32)
    b_l = tl.zeros([BG], tl.float32)
    b_acc = tl.zeros([BG, BV], tl.float32)
    i_head0 = (i_r * (H * G) + i_h * G).to(tl.int64)
    if i_s < S_CMP:
        # -- compressed tokens 0 .. nc-1, split evenly at run time in whole tiles --
        nc = _visible_cmp(pos, CMP_BLOCK, CMP_STRIDE)
        chunk = tl.cdiv(tl.cdiv(nc, S_CMP), BC) * BC
        lo = i_s * chunk
        hi = tl.minimum(lo + chunk, nc)
        p_k = k_cmp + i_b * s_kcb + i_h * s_kch
        p_v = v_cmp + i_b * s_vcb + i_h * s_vch
        b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kct, s_vct, lo, hi, b_m, b_l, b_acc, qk_scale,
                                        blk_p + i_head0 * NT_CAP * JT, blk_m + i_head0 * NT_CAP, NT_CAP * JT, NT_CAP,
                                        G, K, V, BG, BK, BV, BC, PREC, True, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK, JT, JTP)  # fmt: skip
    else:
        # -- window positions pos - w < s <= pos, split in S_WIN equal parts --
        w_chunk = (WINDOW + S_WIN - 1) // S_WIN
        lo = tl.maximum(pos + 1 - WINDOW, 0) + (i_s - S_CMP) * w_chunk
        hi = tl.minimum(lo + w_chunk, pos + 1)
        p_k = k_win + i_b * s_kwb + i_h * s_kwh
        p_v = v_win + i_b * s_vwb + i_h * s_vwh
        b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kwt, s_vwt, lo, hi, b_m, b_l, b_acc, qk_scale,
                                        blk_p, blk_m, 0, 0,
                                        G, K, V, BG, BK, BV, BC, PREC, False, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK, JT, JTP)  # fmt: skip
    _store_partial(o_part, m_part, l_part, i_r, i_h, i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV)


@triton.jit
def _merge_stats(m_part, l_part, i_rq, m_h, lo, hi, S, BSX: tl.constexpr):
    """Max ``[HP]`` (0 when empty) and sum ``[HP]`` of the heads' splits ``[lo, hi)``, log2 units."""
    o_sx = lo + tl.arange(0, BSX)
    m_hs = m_h[:, None] & (o_sx[None, :] < hi)
    b_ms = tl.load(m_part + i_rq[:, None] * S + o_sx[None, :], mask=m_hs, other=float("-inf"), cache_modifier=".cg")
    b_ls = tl.load(l_part + i_rq[:, None] * S + o_sx[None, :], mask=m_hs, other=0.0, cache_modifier=".cg")
    b_mx = tl.max(b_ms, 1)
    b_mx = tl.where(b_mx == float("-inf"), 0.0, b_mx)
    return b_mx, b_ms, tl.sum(b_ls * tl.exp2(b_ms - b_mx[:, None]), 1)


@triton.jit
def _merge_splits(o_part, m_part, l_part, i_rq, m_h, lo, hi, S, V: tl.constexpr, BV: tl.constexpr, BSX: tl.constexpr):
    """Normalised attention output ``[HP, BV]`` of heads ``i_rq [HP]`` over their splits
    ``[lo, hi)``, all loaded at once; a branch with nothing visible gives 0."""
    o_sx = lo + tl.arange(0, BSX)
    o_v = tl.arange(0, BV)
    b_mx, b_ms, b_sum = _merge_stats(m_part, l_part, i_rq, m_h, lo, hi, S, BSX)
    b_w = tl.exp2(b_ms - b_mx[:, None]) * tl.where(b_sum > 0, 1.0 / tl.where(b_sum > 0, b_sum, 1.0), 0.0)[:, None]
    p_o = o_part + (i_rq[:, None, None] * S + o_sx[None, :, None]) * V + o_v[None, None, :]
    m_o = m_h[:, None, None] & (o_sx[None, :, None] < hi) & (o_v[None, None, :] < V)
    b_acc = tl.load(p_o, mask=m_o, other=0.0, cache_modifier=".cg")  # [HP, BSX, BV]
    return tl.sum(b_w[:, :, None] * b_acc, 1)


@triton.jit
def _block_scores(
    blk_p, blk_m, p_sc, i_rq, m_g, b_lse, nc, own, NT_CAP,  #
    BC: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,  #
    JT: tl.constexpr, NCOVER: tl.constexpr, BJ: tl.constexpr,
):
    """Group score (Eqs. 9-10) of every block ``0 .. own`` into ``p_sc``, from the tile partials.

    Block ``j`` gathers the tiles ``t`` holding its overlapping compressed tokens
    (at most ``NCOVER``), each at offset ``j - t*BC*d // l'`` and weighted by ``exp2(m_t - lse)``."""
    for j0 in range(0, own + 1, BJ):
        o_j = j0 + tl.arange(0, BJ)
        i_min = tl.maximum(o_j * SEL_BLOCK - CMP_BLOCK + CMP_STRIDE, 0) // CMP_STRIDE  # first token touching j
        i_max = tl.minimum(((o_j + 1) * SEL_BLOCK - 1) // CMP_STRIDE, nc - 1)  # last visible one
        t_lo = i_min // BC
        b_score = tl.zeros([BJ], tl.float32)
        for u in tl.static_range(NCOVER):
            i_t = t_lo + u
            m_u = (o_j <= own) & (i_min <= i_max) & (i_t <= i_max // BC)
            jj = o_j - (i_t * (BC * CMP_STRIDE)) // SEL_BLOCK
            m_gu = m_g[:, None] & m_u[None, :]
            b_bp = tl.load(blk_p + (i_rq[:, None] * NT_CAP + i_t[None, :]) * JT + jj[None, :], mask=m_gu, other=0.0)  # [BG, BJ]
            b_bm = tl.load(blk_m + i_rq[:, None] * NT_CAP + i_t[None, :], mask=m_gu, other=float("-inf"))
            b_score += tl.sum(tl.exp2(b_bm - b_lse[:, None]) * b_bp, 0)
        tl.store(p_sc + o_j, b_score, mask=o_j <= own)


@triton.jit
def _block_keys(p_sc, j0, own, INIT: tl.constexpr, LOCAL: tl.constexpr, TJ: tl.constexpr):
    """Keys of blocks ``[j0, j0 + TJ)`` (-1 past the query's own block)."""
    o_j = j0 + tl.arange(0, TJ)
    m_j = o_j <= own
    b_sc = tl.load(p_sc + o_j, mask=m_j, other=0.0)
    forced = (o_j < INIT) | (o_j > own - LOCAL)
    b_bits = tl.where(forced, INF_BITS, b_sc.to(tl.int32, bitcast=True)).to(tl.int64)
    b_key = b_bits * KEY_SHIFT + (KEY_INDEX_MAX - o_j.to(tl.int64))
    return o_j, tl.where(m_j, b_key, -1)


@triton.jit
def _top_n_threshold(p_sc, own, N: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr, TJ: tl.constexpr, ONE_TILE: tl.constexpr):
    """The smallest of the ``N`` largest visible block keys (0 when all visible blocks fit).

    Keys are distinct, so the n-th largest is found by ``N`` rounds of "largest key
    below the last one"; with ``ONE_TILE`` every key stays in registers."""
    thr = tl.full([], 0, tl.int64)
    if own + 1 > N:
        thr = tl.full([], INT64_MAX, tl.int64)
        if ONE_TILE:
            _, b_key = _block_keys(p_sc, 0, own, INIT, LOCAL, TJ)
            for _ in range(N):
                thr = tl.max(tl.where(b_key < thr, b_key, -1), 0)
        else:
            for _ in range(N):
                best = tl.full([], -1, tl.int64)
                for j0 in range(0, own + 1, TJ):
                    _, b_key = _block_keys(p_sc, j0, own, INIT, LOCAL, TJ)
                    best = tl.maximum(best, tl.max(tl.where(b_key < thr, b_key, -1), 0))
                thr = best
    return thr




@triton.jit
def _select_ranks(p_sc, p_idx, own, thr, i_s, N: tl.constexpr, NP: tl.constexpr, INIT: tl.constexpr,
                  LOCAL: tl.constexpr, TJ: tl.constexpr, SB: tl.constexpr):
    """Blocks of ranks ``i_s*SB ..`` (ascending) among those with key >= ``thr`` ([SB], -1 past
    the last); program 0 also writes the whole ascending list, padded with -1, to ``p_idx``."""
    o_sb = i_s * SB + tl.arange(0, SB)
    b_j = tl.full([SB], -1, tl.int64)
    count = tl.full([], 0, tl.int32)
    for j0 in range(0, own + 1, TJ):
        o_j, b_key = _block_keys(p_sc, j0, own, INIT, LOCAL, TJ)
        b_sel = b_key >= thr
        b_rank = tl.cumsum(b_sel.to(tl.int32), 0) + count  # [TJ] 1-based among the selected
        b_hit = b_sel[None, :] & (b_rank[None, :] == o_sb[:, None] + 1)  # [SB, TJ]
        b_j = tl.maximum(b_j, tl.max(tl.where(b_hit, o_j[None, :], -1), 1))
        if i_s == 0:
            tl.store(p_idx + b_rank - 1, o_j.to(tl.int32), mask=b_sel)
        count += tl.sum(b_sel.to(tl.int32), 0)
    if i_s == 0:
        o_n = tl.arange(0, NP)
        tl.store(p_idx + o_n, tl.full([NP], -1, tl.int32), mask=(o_n >= count) & (o_n < N))
    return b_j


@triton.jit
def decode_selected_fwd_kernel(
    q, k, v, seq_lens, gates,  #
    blk_p, blk_m, o_part, m_part, l_part,  #
    scores, base, ticket, block_idx, o,  #
    s_qr, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,  #
    qk_scale, NT_CAP, NBLK_CAP, S_CMP, S_WIN, S,  #
    TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr, SB: tl.constexpr, NS: tl.constexpr,  #
    HPP: tl.constexpr, BHP: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,  #
    BSC: tl.constexpr, BSW: tl.constexpr, BSS: tl.constexpr,  #
    BJ: tl.constexpr, TJ: tl.constexpr, ONE_TILE: tl.constexpr, JT: tl.constexpr, NCOVER: tl.constexpr, PREC: tl.constexpr,
):
    i_s, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    i_b, pos = _row_position(seq_lens, i_r, TQ)
    own = pos // SEL_BLOCK
    o_g = tl.arange(0, BG)
    o_v = tl.arange(0, BV)
    m_g = o_g < G
    i_rq = (i_r * (H * G) + i_h * G + o_g).to(tl.int64)  # [BG] global head rows
    # -- each head's log2-sum-exp over the compressed splits, then the group's block scores --
    b_mx, _, b_sum = _merge_stats(m_part, l_part, i_rq, m_g, 0, S_CMP, S, BSC)
    b_lse = b_mx + tl.log2(tl.where(b_sum > 0, b_sum, 1.0))
    p_sc = scores + (i_s * tl.num_programs(1) + i_rh).to(tl.int64) * NBLK_CAP
    _block_scores(blk_p, blk_m, p_sc, i_rq, m_g, b_lse, _visible_cmp(pos, CMP_BLOCK, CMP_STRIDE), own, NT_CAP,
                  BC, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK, JT, NCOVER, BJ)  # fmt: skip
    # -- top-n, then attention over this program's selected blocks, positions <= pos --
    thr = _top_n_threshold(p_sc, own, N, INIT, LOCAL, TJ, ONE_TILE)
    b_j = _select_ranks(p_sc, block_idx + i_rh.to(tl.int64) * N, own, thr, i_s, N, NP, INIT, LOCAL, TJ, SB)
    b_q = _load_group_q(q, i_r, i_h, s_qr, s_qh, G, K, BG, BK)
    b_m = tl.full([BG], float("-inf"), tl.float32)
    b_l = tl.zeros([BG], tl.float32)
    b_acc = tl.zeros([BG, BV], tl.float32)
    p_k = k + i_b * s_kb + i_h * s_kh
    p_v = v + i_b * s_vb + i_h * s_vh
    for r in tl.static_range(SB):
        j = tl.sum(tl.where(tl.arange(0, SB) == r, b_j, 0), 0)
        lo = tl.maximum(j, 0) * SEL_BLOCK
        hi = tl.where(j >= 0, tl.minimum(lo + SEL_BLOCK, pos + 1), lo)
        b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kt, s_vt, lo, hi, b_m, b_l, b_acc, qk_scale, blk_p, blk_m, 0, 0,
                                        G, K, V, BG, BK, BV, BC, PREC, False, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK, JT, 16)  # fmt: skip
    _store_partial(o_part, m_part, l_part, i_r, i_h, S_CMP + S_WIN + i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV)
    # -- gated compressed + window output of this program's share of the heads --
    o_hp = i_s * HPP + tl.arange(0, BHP)
    m_hp = (o_hp < G) & (tl.arange(0, BHP) < HPP)
    i_hq = (i_r * (H * G) + i_h * G + o_hp).to(tl.int64)
    b_cmp = _merge_splits(o_part, m_part, l_part, i_hq, m_hp, 0, S_CMP, S, V, BV, BSC)
    b_win = _merge_splits(o_part, m_part, l_part, i_hq, m_hp, S_CMP, S_CMP + S_WIN, S, V, BV, BSW)
    g_cmp = tl.load(gates + i_hq * 3, mask=m_hp, other=0.0).to(tl.float32)
    g_win = tl.load(gates + i_hq * 3 + 2, mask=m_hp, other=0.0).to(tl.float32)
    m_hv = m_hp[:, None] & (o_v[None, :] < V)
    tl.store(base + i_hq[:, None] * V + o_v[None, :], g_cmp[:, None] * b_cmp + g_win[:, None] * b_win, mask=m_hv)
    # -- the last program of this row and group adds the selected branch and writes o --
    tl.debug_barrier()  # every thread's stores precede the release below
    done = tl.atomic_add(ticket + i_rh, 1, sem="acq_rel", scope="gpu")
    if done == NS - 1:
        b_slc = _merge_splits(o_part, m_part, l_part, i_rq, m_g, S_CMP + S_WIN, S, S, V, BV, BSS)
        m_gv = m_g[:, None] & (o_v[None, :] < V)
        b_base = tl.load(base + i_rq[:, None] * V + o_v[None, :], mask=m_gv, other=0.0, cache_modifier=".cg")
        g_slc = tl.load(gates + i_rq * 3 + 1, mask=m_g, other=0.0).to(tl.float32)
        b_o = b_base + g_slc[:, None] * b_slc
        tl.store(o + i_rq[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_gv)


def _pow2(x: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(x))


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def default_splits(rows_groups: int, nc_cap: int, config: NSAConfig, device: torch.device) -> Tuple[int, int, int]:
    """``(compressed splits, window splits, selected blocks per program)``.

    The compressed branch is the bulk of the bytes: split it into about two programs
    per SM whatever the batch, never under ~128 tokens a split. The window takes
    ~128-token splits; a selected program takes two blocks at small batch and four
    once the batch alone fills the GPU."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
    s_cmp = max(1, min(triton.cdiv(2 * sms, rows_groups), triton.cdiv(nc_cap, 128)))
    s_win = max(1, triton.cdiv(config.window, 128))
    per_program = 2 if rows_groups * config.sel_count <= 4 * sms else 4
    return s_cmp, s_win, per_program


def decode_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    seq_lens: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    config: NSAConfig,
    scale: float,
    *,
    splits: Optional[Tuple[int, int, int]] = None,
    block_tile: Optional[int] = None,
    token_tile: Optional[int] = None,
    num_warps: Tuple[int, int] = (4, 8),
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Launch the two decode kernels; returns ``(o, block_idx)``.

    Overrides of the automatic choices (for tests and tuning): ``splits = (compressed,
    window, selected blocks per program)``, ``block_tile`` (blocks scanned at once by
    top-n), ``token_tile`` (tokens per attention tile), ``num_warps`` of the two kernels.
    """
    B, TQ, HQ, K = q.shape
    H, V = k.shape[2], v.shape[3]
    G, rows = HQ // H, B * TQ
    q = _last_dim_contiguous(q).reshape(rows, HQ, K)
    gates = gates.reshape(rows * HQ, 3).contiguous()
    k, v, k_cmp, v_cmp, k_win, v_win = (_last_dim_contiguous(t) for t in (k, v, k_cmp, v_cmp, k_win, v_win))
    cfg, n = config, config.sel_count
    nc_cap, nblk_cap = max(k_cmp.shape[1], 1), cfg.num_sel_blocks(k.shape[1])
    BG, BK, BV = _pow2(G), _pow2(K), _pow2(V)
    BC = token_tile or (64 if max(BK, BV) <= 128 else 32)
    s_cmp, s_win, sb = splits if splits is not None else default_splits(rows * H, nc_cap, cfg, q.device)
    # the last program merges all selected splits of the group at once: keep them in registers
    sb = max(sb, triton.cdiv(n, max(1, 16384 // (BG * BV))))
    s_slc = triton.cdiv(n, sb)
    S = s_cmp + s_win + s_slc
    # block partials: a tile of BC compressed tokens touches at most JT blocks, a block at most NCOVER tiles
    nt_cap = triton.cdiv(nc_cap, BC)
    jt = (BC * cfg.cmp_stride + cfg.cmp_block + cfg.sel_block - 2 * cfg.cmp_stride - 1) // cfg.sel_block + 1
    ncover = triton.cdiv((cfg.sel_block + cfg.cmp_block) // cfg.cmp_stride - 2, BC) + 1
    PREC = "ieee" if q.dtype == torch.float32 else "tf32"
    f32 = dict(device=q.device, dtype=torch.float32)
    blk_p, blk_m = torch.empty(rows * HQ, nt_cap, jt, **f32), torch.empty(rows * HQ, nt_cap, **f32)
    o_part, m_part, l_part = torch.empty(rows * HQ, S, V, **f32), torch.empty(rows * HQ, S, **f32), torch.empty(rows * HQ, S, **f32)
    scores, base = torch.empty(s_slc, rows * H, nblk_cap, **f32), torch.empty(rows * HQ, V, **f32)
    ticket = torch.zeros(rows * H, device=q.device, dtype=torch.int32)
    block_idx = torch.empty(B, TQ, H, n, device=q.device, dtype=torch.int32)
    o = torch.empty(B, TQ, HQ, V, device=q.device, dtype=q.dtype)
    qk_scale = scale * LOG2E
    geometry = dict(CMP_BLOCK=cfg.cmp_block, CMP_STRIDE=cfg.cmp_stride, SEL_BLOCK=cfg.sel_block)
    common = dict(TQ=TQ, H=H, G=G, K=K, V=V, BG=BG, BK=BK, BV=BV, BC=BC, JT=jt, PREC=PREC, **geometry)
    decode_cmp_win_fwd_kernel[(s_cmp + s_win, rows * H)](
        q, k_cmp, v_cmp, k_win, v_win, seq_lens,  #
        blk_p, blk_m, o_part, m_part, l_part,  #
        q.stride(0), q.stride(1),  #
        k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2), v_cmp.stride(0), v_cmp.stride(1), v_cmp.stride(2),  #
        k_win.stride(0), k_win.stride(1), k_win.stride(2), v_win.stride(0), v_win.stride(1), v_win.stride(2),  #
        qk_scale, nt_cap, s_cmp, s_win, S,  #
        WINDOW=cfg.window, JTP=_pow2(jt), num_warps=num_warps[0], **common,
    )  # fmt: skip
    tj = block_tile or min(1024, _pow2(nblk_cap))
    hpp = triton.cdiv(G, s_slc)
    decode_selected_fwd_kernel[(s_slc, rows * H)](
        q, k, v, seq_lens, gates,  #
        blk_p, blk_m, o_part, m_part, l_part,  #
        scores, base, ticket, block_idx, o,  #
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),  #
        qk_scale, nt_cap, nblk_cap, s_cmp, s_win, S,  #
        N=n, NP=_pow2(n, 2), INIT=cfg.init_blocks, LOCAL=cfg.local_blocks, SB=sb, NS=s_slc, HPP=hpp, BHP=_pow2(hpp, 1),
        BSC=_pow2(s_cmp, 2), BSW=_pow2(s_win, 2), BSS=_pow2(s_slc, 2), BJ=128, TJ=tj, ONE_TILE=nblk_cap <= tj,
        NCOVER=ncover, num_warps=num_warps[1], **common,
    )  # fmt: skip
    return o, block_idx


def nsa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    seq_lens: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    config: NSAConfig,
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`nsa.ops.decode.reference.nsa_decode` (no backward)."""
    return decode_fwd(q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win, config, scale)
