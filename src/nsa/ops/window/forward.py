"""The sliding-window forward kernel (:mod:`nsa.ops.window.kernel` launches it): a program's query
tile walks its band's key tiles, with the selected branch's forced blocks where it takes them."""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.ops._triton.attention import attn_fwd_finish, attn_fwd_step, head_columns, kv_head_bases, row_offsets
from nsa.ops.gates.kernel import gated_sum
from nsa.ops.window.tiles import band_kv, key_band, query_tile_program


@triton.jit
def _fwd_keys(
    b_q, b_acc, b_m, b_l,  #
    p_k, p_v, stride_kt, stride_vt,  #
    o_pos, t_hi, W, s_lo, s_hi, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
    BN: tl.constexpr, MASK: tl.constexpr, PREC: tl.constexpr,
):
    """Online softmax over key tiles starting at ``s_lo, s_lo + BN, ... < s_hi``."""
    for s0 in range(s_lo, s_hi, BN):
        b_k, b_v, m_qk = band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, MASK)
        b_acc, b_m, b_l = attn_fwd_step(b_q, b_k, b_v, b_acc, b_m, b_l, m_qk, qk_scale, MASK, PREC)
    return b_acc, b_m, b_l


@triton.jit(do_not_specialize=["T", "q_offset", "W"])
def window_fwd_kernel(
    q, k, v, o, lse, gates, o_cmp, o_slc, o_win, o_frc, lse_frc,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,  #
    T, q_offset, W, qk_scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,  #
    BT: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, GATED: tl.constexpr, KEEP: tl.constexpr,  #
    FORCED: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,
):
    """Grid ``(cdiv(T, BT), B * H)``: ``o [B, T, HQ, DV]`` and log2-domain ``lse [B, T, HQ]``.

    With ``GATED``, ``o`` receives the gated sum of the three branches instead (``gates
    [B, T, HQ, 3]``, ``o_cmp``/``o_slc`` contiguous like ``o``) and ``lse`` is not written,
    unless ``KEEP``: then the window's own output goes to ``o_win`` and ``lse`` is written
    (training keeps both for the backward).

    With ``FORCED`` (not with ``GATED``), the program also leaves the selected branch's
    attention over the forced blocks (``INIT`` initial, ``LOCAL`` local; selection blocks of
    ``BN`` keys) in ``o_frc``/``lse_frc``, the starting state of the selected kernel, as
    the selected branch's forced-block kernel would. The caller guarantees what makes this
    exact: the selected branch reads these keys and values, every row's list holds its forced
    blocks (as the NSA selection's always do), the ``BT`` positions lie in one selection
    block, ``LOCAL >= 1``, and the local blocks lie inside the window (``W >= LOCAL * BN``).
    The local blocks are then the band's last tiles, and for them the band mask equals the
    selected branch's causal one: walked first, they leave the online-softmax state of the
    selected branch over them. Only the initial blocks left of them cost one more step each."""
    i_t, i_b, i_h, o_i, o_hq, m_r, o_pos = query_tile_program(T, q_offset, H, G, GP, BT)  # rows [BM] each
    HQ: tl.constexpr = H * G
    BM: tl.constexpr = BT * GP
    o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)

    p_q = q + row_offsets(i_b, o_i, o_hq, sqb, sqt, sqh)[:, None] + o_dk[None, :]
    b_q = tl.load(p_q, mask=m_r[:, None] & m_dk[None, :], other=0.0)  # [BM, BK]
    p_k, p_v = kv_head_bases(k, v, i_b, i_h, skb, skh, svb, svh)

    t_hi, first, mid_lo, mid_hi = key_band(i_t, T, q_offset, W, BT, BN)

    b_acc = tl.zeros([BM, BV], dtype=tl.float32)
    b_m = tl.full([BM], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BM], dtype=tl.float32)
    o_row = row_offsets(i_b, o_i, o_hq, T * HQ, HQ, 1)  # [BM] rows of [B * T * HQ]
    w_end = t_hi + 1  # the window's keys still to walk: [first, w_end)
    if FORCED:
        # -- the local blocks first: the selected branch's state over them is the window's --
        j_own = (q_offset + i_t * BT) // BN
        s_local = tl.maximum(j_own - LOCAL + 1, 0) * BN
        b_acc, b_m, b_l = _fwd_keys(
            b_q, b_acc, b_m, b_l, p_k, p_v, skt, svt, o_pos, t_hi, W, s_local, t_hi + 1,  #
            o_dk, o_dv, m_dk, m_dv, qk_scale, BN, True, PREC,
        )
        # -- then the initial blocks left of them, wholly before every row: no mask --
        f_acc, f_m, f_l = b_acc, b_m, b_l
        for s0 in range(0, tl.minimum(INIT * BN, s_local), BN):
            b_k, b_v, m_unused = band_kv(p_k, p_v, skt, svt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, False)
            f_acc, f_m, f_l = attn_fwd_step(b_q, b_k, b_v, f_acc, f_m, f_l, m_unused, qk_scale, False, PREC)
        f_o, f_lse = attn_fwd_finish(f_acc, f_m, f_l)
        tl.store(o_frc + o_row[:, None] * DV + o_dv[None, :], f_o.to(o_frc.dtype.element_ty),
                 mask=m_r[:, None] & m_dv[None, :])
        tl.store(lse_frc + o_row, f_lse, mask=m_r)
        w_end = tl.minimum(s_local, w_end)
    mid_lo = tl.minimum(mid_lo, w_end)
    mid_hi = tl.minimum(mid_hi, w_end)
    b_acc, b_m, b_l = _fwd_keys(
        b_q, b_acc, b_m, b_l, p_k, p_v, skt, svt, o_pos, t_hi, W, first, mid_lo,  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, BN, True, PREC,
    )
    b_acc, b_m, b_l = _fwd_keys(
        b_q, b_acc, b_m, b_l, p_k, p_v, skt, svt, o_pos, t_hi, W, mid_lo, mid_hi,  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, BN, False, PREC,
    )
    b_acc, b_m, b_l = _fwd_keys(
        b_q, b_acc, b_m, b_l, p_k, p_v, skt, svt, o_pos, t_hi, W, mid_hi, w_end,  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, BN, True, PREC,
    )
    b_o, b_lse = attn_fwd_finish(b_acc, b_m, b_l)

    o_x = o_row[:, None] * DV + o_dv[None, :]
    m_x = m_r[:, None] & m_dv[None, :]
    if GATED:
        # the gates kernel's sum, from the window output rounded as it would be stored
        b_win = b_o.to(o.dtype.element_ty).to(tl.float32)
        b_sum = gated_sum(gates, o_cmp, o_slc, o, b_win, o_row, m_r, o_x, m_x, 2)  # o: o_win's unread slot
        tl.store(o + o_x, b_sum.to(o.dtype.element_ty), mask=m_x)
        if KEEP:
            tl.store(o_win + o_x, b_o.to(o_win.dtype.element_ty), mask=m_x)
            tl.store(lse + o_row, b_lse, mask=m_r)
    else:
        tl.store(o + o_x, b_o.to(o.dtype.element_ty), mask=m_x)
        tl.store(lse + o_row, b_lse, mask=m_r)
