"""The selected-attention forward kernels (:mod:`nsa.ops.selected.kernel` launches them): the selected
blocks of each query position and KV group, and the forced blocks alone where the window kernel
does not take them."""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.ops._triton.attention import attn_fwd_finish, attn_fwd_step, head_columns, kv_head_bases, row_offsets
from nsa.ops.gates.kernel import gated_sum
from nsa.ops.selected.tiles import entry_kv, forced_kv, forced_range, forced_tile, query_tile, tile_selection


@triton.jit(do_not_specialize=["T", "q_offset"])
def selected_fwd_kernel(
    q, k, v, block_idx, o, lse,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,  #
    T, q_offset, qk_scale,  #
    gates, o_cmp, o_win, o_sum,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BQ: tl.constexpr, PREC: tl.constexpr,
    SUMMED: tl.constexpr = False, KEEP: tl.constexpr = True, d_k=None, d_v=None, KV_DESC: tl.constexpr = False,
    KEY_TILES: tl.constexpr = 1,
):
    """Grid ``(cdiv(T, BQ), B * H)``: ``o [B, T, HQ, DV]`` and log2-domain ``lse [B, T, HQ]``.

    With forced blocks (``INIT + LOCAL > 0``), ``o``/``lse`` already hold the result
    over them (:func:`selected_forced_fwd_kernel`, or the window kernel's): it is the
    starting state. With ``SUMMED``, ``o_sum`` receives the gated sum of the three branches
    (``gates [B, T, HQ, 3]``, ``o_cmp``/``o_win`` contiguous like ``o``), and ``o``/``lse``
    are written only with ``KEEP`` (training keeps them for the backward). ``KEY_TILES``: tiles a
    block is read in (:func:`~nsa.ops.selected.tiles.step_entry`).
    """
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HQ: tl.constexpr = H * G
    o_i, o_hq, m_g, o_pos, o_rq = query_tile(i_t, i_h, T, q_offset, G, GP, BQ)
    o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)

    b_q = tl.load(q + row_offsets(i_b, o_i, o_hq, sqb, sqt, sqh)[:, None] + o_dk[None, :], mask=m_g[:, None] & m_dk[None, :], other=0.0)  # [BQ * GP, BK]
    # keys need a mask only without a local block (the own block is in the list) or past BS;
    # rows of a tile, for the blocks that their query does not hold
    MASK: tl.constexpr = (LOCAL == 0) or (BS != BSP) or (BQ > 1)
    b_rank, b_blk, b_who, n_entries = tile_selection(block_idx, i_b, i_h, i_t, T, q_offset, H, N, NP, BQ, BS,
                                                     INIT, LOCAL)
    t_last = tl.minimum(i_t * BQ + BQ, T) - 1 + q_offset
    p_k, p_v = kv_head_bases(k, v, i_b, i_h, skb, skh, svb, svh)

    p_o = o + row_offsets(i_b, o_i, o_hq, T * HQ * DV, HQ * DV, DV)[:, None] + o_dv[None, :]
    p_lse = lse + row_offsets(i_b, o_i, o_hq, T * HQ, HQ, 1)
    if INIT + LOCAL > 0:
        # normalised (o, lse) is the online-softmax state (acc = o, m = lse, l = 1)
        b_acc = tl.load(p_o, mask=m_g[:, None] & m_dv[None, :], other=0.0).to(tl.float32)
        b_m = tl.load(p_lse, mask=m_g, other=float("-inf"))
        b_l = tl.where(b_m == float("-inf"), 0.0, 1.0)
    else:
        b_acc = tl.zeros([BQ * GP, BV], dtype=tl.float32)
        b_m = tl.full([BQ * GP], float("-inf"), dtype=tl.float32)
        b_l = tl.zeros([BQ * GP], dtype=tl.float32)
    for i in range(n_entries * KEY_TILES):
        b_k, b_v, m_qk = entry_kv(p_k, p_v, skt, svt, b_rank, b_blk, b_who, i, t_last, o_pos, o_rq,
                                  o_dk, o_dv, m_dk, m_dv, BS, BSP, LOCAL, BQ, d_k, d_v, i_b, i_h, KV_DESC, KEY_TILES)
        b_acc, b_m, b_l = attn_fwd_step(b_q, b_k, b_v, b_acc, b_m, b_l, m_qk, qk_scale, MASK, PREC)
    b_o, b_lse = attn_fwd_finish(b_acc, b_m, b_l)

    if SUMMED:
        # the gates kernel's sum, from this output rounded as it would be stored
        o_row = row_offsets(i_b, o_i, o_hq, T * HQ, HQ, 1)
        p_x = o_row[:, None] * DV + o_dv[None, :]
        m_x = m_g[:, None] & m_dv[None, :]
        b_sum = gated_sum(gates, o_cmp, o, o_win, b_o.to(o.dtype.element_ty).to(tl.float32), o_row, m_g, p_x, m_x, 1)
        tl.store(o_sum + p_x, b_sum.to(o_sum.dtype.element_ty), mask=m_x)
    if KEEP:
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_g[:, None] & m_dv[None, :])
        tl.store(p_lse, b_lse, mask=m_g)


@triton.jit(do_not_specialize=["T", "q_offset"])
def selected_forced_fwd_kernel(
    q, k, v, block_idx, o, lse,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,  #
    T, q_offset, qk_scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
    KEY_TILES: tl.constexpr = 1,
):
    """Grid ``(cdiv(T, BT), B * H)``: attention over the forced blocks only, written to
    ``o``/``lse`` as the starting state of :func:`selected_fwd_kernel` (``KEY_TILES`` as there).

    Every query of a selection block shares its forced blocks (initial + local), so a
    tile of ``BT`` positions x ``GP`` heads loads each of them once, not once per query.
    """
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HQ: tl.constexpr = H * G
    o_i, o_hq, m_r, o_pos, o_j, b_list = forced_tile(block_idx, i_b, i_h, i_t, T, q_offset, H, G, GP, BT, N, NP, BS)
    o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)
    b_q = tl.load(q + row_offsets(i_b, o_i, o_hq, sqb, sqt, sqh)[:, None] + o_dk[None, :], mask=m_r[:, None] & m_dk[None, :], other=0.0)
    p_k, p_v = kv_head_bases(k, v, i_b, i_h, skb, skh, svb, svh)
    j_lo = (q_offset + i_t * BT) // BS
    j_hi = (tl.minimum(q_offset + i_t * BT + BT, q_offset + T) - 1) // BS

    BM: tl.constexpr = BT * GP
    b_acc = tl.zeros([BM, BV], dtype=tl.float32)
    b_m = tl.full([BM], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BM], dtype=tl.float32)
    l_lo, n_forced = forced_range(j_lo, j_hi, INIT, LOCAL)
    for i in range(n_forced * KEY_TILES):
        b_k, b_v, m_qk = forced_kv(p_k, p_v, skt, svt, b_list, i, l_lo, o_j, o_pos, m_r, o_dk, o_dv, m_dk, m_dv, BS, BSP,
                                   INIT, LOCAL, KEY_TILES)
        b_acc, b_m, b_l = attn_fwd_step(b_q, b_k, b_v, b_acc, b_m, b_l, m_qk, qk_scale, True, PREC)
    b_o, b_lse = attn_fwd_finish(b_acc, b_m, b_l)

    p_o = o + row_offsets(i_b, o_i, o_hq, T * HQ * DV, HQ * DV, DV)[:, None] + o_dv[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_r[:, None] & m_dv[None, :])
    tl.store(lse + row_offsets(i_b, o_i, o_hq, T * HQ, HQ, 1), b_lse, mask=m_r)
