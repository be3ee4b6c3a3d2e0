"""Launch 1 of a decode step: split-K attention over the visible compressed tokens (the split size
follows the length at run time) and, unless launch 3 takes them, over the window; every split
writes its partial, and the compressed splits what scoring needs (:mod:`.sink`)."""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.ops.decode.tiles import (
    attend_full_tiles_desc,
    attend_range,
    row_group_program,
    store_partial,
    visible_cmp,
    window_split,
)


@triton.jit
def decode_cmp_win_fwd_kernel(
    q, k_cmp, v_cmp, k_win, v_win, seq_lens, k_cmp_ptr, v_cmp_ptr, k_win_ptr, v_win_ptr,  #
    logits, o_part, m_part, l_part,  #
    s_qr, s_qh,  #
    s_kcb, s_kct, s_kch, s_vcb, s_vct, s_vch,  #
    s_kwb, s_kwt, s_kwh, s_vwb, s_vwt, s_vwh,  #
    qk_scale, SINK_STRIDE, S_CMP, S_WIN, S,  #
    TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, WINDOW: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
    CMP_DESC: tl.constexpr, WIN_DESC: tl.constexpr, KEEP: tl.constexpr,
    MASS: tl.constexpr, SEL_BLOCK: tl.constexpr, R: tl.constexpr,
):
    """The compressed splits leave, per head, either every logit (``logits`` rows of
    ``SINK_STRIDE``) or, with ``MASS``, each tile's block masses
    (:func:`~nsa.ops.decode.sink.store_block_mass`, same rows). With ``CMP_DESC``,
    ``k_cmp``/``v_cmp`` are tensor descriptors (block ``[1, BC, 1, D]``) and the whole tiles of a
    compressed split go through them; the masked last tile, if any, still uses plain loads
    (``k_cmp_ptr``/``v_cmp_ptr``, the same caches as tensors, through which every tile goes
    without ``CMP_DESC``). ``WIN_DESC`` does the same for the window. Logits and
    partials are stored with the L2 eviction policy ``KEEP``."""
    i_s, i_r, i_h, i_b, pos, b_q = row_group_program(q, seq_lens, s_qr, s_qh, TQ, H, G, K, BG, BK, PDL)
    b_m = tl.full([BG], float("-inf"), tl.float32)
    b_l = tl.zeros([BG], tl.float32)
    b_acc = tl.zeros([BG, BV], tl.float32)
    if i_s < S_CMP:
        # -- compressed tokens 0 .. nc-1, split evenly at run time --
        nc = visible_cmp(pos, CMP_BLOCK, CMP_STRIDE)
        chunk = tl.cdiv(tl.cdiv(nc, S_CMP), BC) * BC
        lo = i_s * chunk
        hi = tl.minimum(lo + chunk, nc)
        p_s = logits + (i_r * (H * G) + i_h * G).to(tl.int64) * SINK_STRIDE
        STORE: tl.constexpr = 2 if MASS else 1
        b_m, b_l, b_acc = _attend_split(b_q, k_cmp, v_cmp, k_cmp_ptr, v_cmp_ptr,
                                        s_kcb, s_kct, s_kch, s_vcb, s_vct, s_vch, i_b, i_h, lo, hi, b_m, b_l, b_acc, qk_scale,
                                        p_s, SINK_STRIDE, G, K, V, BG, BK, BV, BC, STORE, PREC, KEEP,
                                        R, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK, CMP_DESC)  # fmt: skip
    else:
        lo, hi = window_split(pos, i_s - S_CMP, S_WIN, WINDOW)
        b_m, b_l, b_acc = _attend_split(b_q, k_win, v_win, k_win_ptr, v_win_ptr,
                                        s_kwb, s_kwt, s_kwh, s_vwb, s_vwt, s_vwh, i_b, i_h, lo, hi, b_m, b_l, b_acc, qk_scale,
                                        logits, 0, G, K, V, BG, BK, BV, BC, 0, PREC, KEEP, 1, 1, 1, 1, WIN_DESC)  # fmt: skip
    store_partial(o_part, m_part, l_part, i_r, i_h, i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)


@triton.jit
def _attend_split(b_q, d_k, d_v, k, v, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, i_b, i_h, lo, hi, b_m, b_l, b_acc, qk_scale,  #
                  p_s, s_sg, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, BC: tl.constexpr, STORE_S: tl.constexpr, PREC: tl.constexpr, KEEP: tl.constexpr,
                  R: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,
                  DESC: tl.constexpr):
    """:func:`~nsa.ops.decode.tiles.attend_range` over one split's tokens ``[lo, hi)`` of KV head
    ``i_h`` of sequence ``i_b`` in a ``[B, T, H, D]`` cache ``k``/``v``; with ``DESC`` the whole
    tiles go through the tensor descriptors ``d_k``/``d_v`` first
    (:func:`~nsa.ops.decode.tiles.attend_full_tiles_desc`) and only a masked last tile, if any,
    through plain loads."""
    if DESC:
        whole = tl.maximum(lo + (hi - lo) // BC * BC, lo)
        b_m, b_l, b_acc = attend_full_tiles_desc(b_q, d_k, d_v, i_b, i_h, lo, whole, b_m, b_l, b_acc, qk_scale, p_s, s_sg,
                                                 G, BG, BK, BV, BC, STORE_S, PREC, KEEP, R, CMP_BLOCK, CMP_STRIDE,
                                                 SEL_BLOCK)  # fmt: skip
        lo = whole
    return attend_range(b_q, k + i_b * s_kb + i_h * s_kh, v + i_b * s_vb + i_h * s_vh, s_kt, s_vt, lo, hi, b_m, b_l, b_acc,
                        qk_scale, p_s, s_sg, G, K, V, BG, BK, BV, BC, STORE_S, PREC, KEEP, R, CMP_BLOCK, CMP_STRIDE,
                        SEL_BLOCK)  # fmt: skip
