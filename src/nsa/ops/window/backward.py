"""The sliding-window backward kernels (:mod:`nsa.ops.window.kernel` launches them): ``dQ`` over the
forward's band, and ``dK``/``dV`` by one program per key tile over the query tiles that see it."""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.ops._triton.attention import (
    attn_bwd_dkdv_step,
    attn_bwd_dq_step,
    attn_bwd_ds,
    head_columns,
    kv_head_bases,
    load_bwd_rows,
    load_gate,
    row_offsets,
    store_scaled,
)
from nsa.ops.window.tiles import band, band_kv, key_band, query_tile_program, tile_rows


@triton.jit
def _dq_keys(
    b_q, b_do, b_lse, b_delta, b_g, b_dq,  #
    p_k, p_v, stride_kt, stride_vt,  #
    o_pos, t_hi, W, s_lo, s_hi, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
    BN: tl.constexpr, MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
):
    for s0 in range(s_lo, s_hi, BN):
        b_k, b_v, m_qk = band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, MASK)
        b_dq = attn_bwd_dq_step(b_q, b_do, b_lse, b_delta, b_g, b_k, b_v, b_dq, m_qk, qk_scale, MASK, GATED, PREC)
    return b_dq


@triton.jit
def _dq_keys_two_branches(
    b_q, b_do, b_lse, b_delta, b_g, f_lse, f_delta, f_g, b_dq,  #
    p_k, p_v, stride_kt, stride_vt,  #
    o_pos, t_hi, W, s_lo, s_hi, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
    BN: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
):
    """``dQ`` over key tiles that both the window and the selected branch (as forced local
    blocks, same mask) attend to: one score and one ``dP`` tile serve both branches, whose
    ``dS`` (each with its own lse, delta and gate; the selected one's prefixed ``f_``) are
    added before the single ``dS K`` product."""
    for s0 in range(s_lo, s_hi, BN):
        b_k, b_v, m_qk = band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, True)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BM, BN]
        b_p = tl.where(m_qk, tl.exp2(b_s - b_lse[:, None]), 0.0)
        f_p = tl.where(m_qk, tl.exp2(b_s - f_lse[:, None]), 0.0)
        b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC)  # [BM, BN]
        b_ds = attn_bwd_ds(b_p, b_dp, b_delta, b_g, GATED) + attn_bwd_ds(f_p, b_dp, f_delta, f_g, GATED)
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=PREC)  # [BM, BK]
    return b_dq


@triton.jit(do_not_specialize=["T", "q_offset", "W"])
def window_bwd_dq_kernel(
    q, k, v, do, gate, lse, delta, dq, gate_frc, lse_frc, delta_frc,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,  #
    T, q_offset, W, qk_scale, scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,  #
    BT: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,  #
    FORCED: tl.constexpr = False, INIT: tl.constexpr = 0, LOCAL: tl.constexpr = 0,
):
    """Grid ``(cdiv(T, BT), B * H)``: ``dq [B, T, HQ, DK]``, the forward's tiling; with
    ``ACC`` added to what ``dq`` held (``gate``/``GATED``: :func:`load_gate`).

    With ``FORCED``, also the selected branch's share over its forced blocks (its gate, lse and
    delta in ``gate_frc``/``lse_frc``/``delta_frc``), under the conditions of the forward's
    ``FORCED`` (:func:`~nsa.ops.window.forward.window_fwd_kernel`): the local blocks are the
    band's last key tiles, where the two branches share the scores, and each initial block left
    of them costs one more step."""
    i_t, i_b, i_h, o_i, o_hq, m_r, o_pos = query_tile_program(T, q_offset, H, G, GP, BT)  # rows [BM] each
    HQ: tl.constexpr = H * G
    BM: tl.constexpr = BT * GP
    o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)

    b_q, b_do, b_g, b_lse, b_delta, o_row = load_bwd_rows(
        q, do, gate, lse, delta, i_b, o_i, o_hq, m_r, sqb, sqt, sqh, sdb, sdt, sdh, o_dk, o_dv, m_dk, m_dv, T, HQ,
        GATED,
    )
    p_k, p_v = kv_head_bases(k, v, i_b, i_h, skb, skh, svb, svh)

    t_hi, first, mid_lo, mid_hi = key_band(i_t, T, q_offset, W, BT, BN)

    b_dq = tl.zeros([BM, BK], dtype=tl.float32)
    w_end = t_hi + 1  # the window's keys still to walk: [first, w_end)
    if FORCED:
        f_g = load_gate(gate_frc, o_row, m_r, GATED)
        f_lse = tl.load(lse_frc + o_row, mask=m_r, other=0.0)
        f_delta = tl.load(delta_frc + o_row, mask=m_r, other=0.0)
        s_local = tl.maximum((q_offset + i_t * BT) // BN - LOCAL + 1, 0) * BN
        b_dq = _dq_keys_two_branches(
            b_q, b_do, b_lse, b_delta, b_g, f_lse, f_delta, f_g, b_dq, p_k, p_v, skt, svt, o_pos, t_hi, W,  #
            s_local, t_hi + 1, o_dk, o_dv, m_dk, m_dv, qk_scale, BN, GATED, PREC,
        )
        # the initial blocks left of the local ones: the selected branch's alone, unmasked
        for s0 in range(0, tl.minimum(INIT * BN, s_local), BN):
            b_k, b_v, m_unused = band_kv(p_k, p_v, skt, svt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, False)
            b_dq = attn_bwd_dq_step(b_q, b_do, f_lse, f_delta, f_g, b_k, b_v, b_dq, m_unused, qk_scale, False,
                                    GATED, PREC)
        w_end = tl.minimum(s_local, w_end)
    mid_lo = tl.minimum(mid_lo, w_end)
    mid_hi = tl.minimum(mid_hi, w_end)
    b_dq = _dq_keys(
        b_q, b_do, b_lse, b_delta, b_g, b_dq, p_k, p_v, skt, svt, o_pos, t_hi, W, first, mid_lo,  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, BN, True, GATED, PREC,
    )
    b_dq = _dq_keys(
        b_q, b_do, b_lse, b_delta, b_g, b_dq, p_k, p_v, skt, svt, o_pos, t_hi, W, mid_lo, mid_hi,  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, BN, False, GATED, PREC,
    )
    b_dq = _dq_keys(
        b_q, b_do, b_lse, b_delta, b_g, b_dq, p_k, p_v, skt, svt, o_pos, t_hi, W, mid_hi, w_end,  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, BN, True, GATED, PREC,
    )

    p_dq = dq + row_offsets(i_b, o_i, o_hq, T * HQ * DK, HQ * DK, DK)[:, None] + o_dk[None, :]
    store_scaled(p_dq, b_dq, scale, m_r[:, None] & m_dk[None, :], ACC)


@triton.jit
def _dkdv_queries(
    b_k, b_v, b_dk, b_dv,  #
    q, do, gate, lse, delta, gate_frc, lse_frc, delta_frc, i_b, i_h,  #
    sqb, sqt, sqh, sdb, sdt, sdh,  #
    o_s, T, q_offset, W, i_lo, i_hi, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    BT: tl.constexpr, MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,  #
    FORCED: tl.constexpr = False, BS: tl.constexpr = 1, LOCAL: tl.constexpr = 0,
):
    """dK/dV over query tiles of BT positions starting at ``i_lo, i_lo + BT, ... < i_hi``.

    With ``FORCED`` (and ``MASK``), the tiles hold some of the key tile's blocks as local blocks
    of the selected branch (``t // BS - s // BS < LOCAL``, inside the band): one score tile and
    one ``dP`` tile serve both branches. Their gated probabilities are added before the ``dV``
    product and their ``dS`` (each with its own lse, delta and gate; the selected one's in
    ``gate_frc``/``lse_frc``/``delta_frc``) before the ``dK`` product, as in
    :func:`_dq_keys_two_branches`."""
    HQ: tl.constexpr = H * G
    for i0 in range(i_lo, i_hi, BT):
        o_i, o_hq, m_r, o_pos = tile_rows(i0, i_h, T, q_offset, G, GP, BT)
        b_q, b_do, b_g, b_lse, b_delta, o_row = load_bwd_rows(
            q, do, gate, lse, delta, i_b, o_i, o_hq, m_r, sqb, sqt, sqh, sdb, sdt, sdh, o_dk, o_dv, m_dk, m_dv, T, HQ,
            GATED,
        )
        if MASK:
            m_kq = (o_s[:, None] <= o_pos[None, :]) & (o_s[:, None] > o_pos[None, :] - W) & m_r[None, :]  # [BN, BM]
        else:
            m_kq = None
        if FORCED:
            f_g = load_gate(gate_frc, o_row, m_r, GATED)
            f_lse = tl.load(lse_frc + o_row, mask=m_r, other=0.0)
            f_delta = tl.load(delta_frc + o_row, mask=m_r, other=0.0)
            m_frc = m_kq & (o_pos[None, :] // BS - o_s[:, None] // BS < LOCAL)
            b_st = tl.dot(b_k, tl.trans(b_q), input_precision=PREC) * qk_scale  # [BN, BM]
            b_pt = tl.where(m_kq, tl.exp2(b_st - b_lse[None, :]), 0.0)
            f_pt = tl.where(m_frc, tl.exp2(b_st - f_lse[None, :]), 0.0)
            if GATED:
                b_pt = b_pt * b_g[None, :]
                f_pt = f_pt * f_g[None, :]
            b_dv += tl.dot((b_pt + f_pt).to(b_do.dtype), b_do, input_precision=PREC)  # [BN, BV]
            b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=PREC)  # [BN, BM]
            b_dst = b_pt * (b_dpt - b_delta[None, :]) + f_pt * (b_dpt - f_delta[None, :])
            b_dk += tl.dot(b_dst.to(b_q.dtype), b_q, input_precision=PREC)  # [BN, BK]
        else:
            b_dk, b_dv = attn_bwd_dkdv_step(b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq, qk_scale,
                                            MASK, GATED, PREC)
    return b_dk, b_dv


@triton.jit
def _dkdv_span(
    b_k, b_v, b_dk, b_dv,  #
    q, do, gate, lse, delta, gate_frc, lse_frc, delta_frc, i_b, i_h,  #
    sqb, sqt, sqh, sdb, sdt, sdh,  #
    o_s, T, q_offset, W, lo, hi, i_first, i_local, mid_lo, mid_hi, i_end, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    BT: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,  #
    FORCED: tl.constexpr, BS: tl.constexpr, LOCAL: tl.constexpr,
):
    """dK/dV over the query tiles in ``[lo, hi)`` of a key tile's band, which splits into the rows
    holding the tile's blocks as local ones ``[i_first, i_local)`` (``FORCED`` only), a masked
    head up to ``mid_lo``, the unmasked ``[mid_lo, mid_hi)`` and a masked tail up to ``i_end``
    (all multiples of BT but ``i_end``, as ``lo`` and ``hi``)."""
    if FORCED:
        b_dk, b_dv = _dkdv_queries(
            b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, gate_frc, lse_frc, delta_frc, i_b, i_h,  #
            sqb, sqt, sqh, sdb, sdt, sdh, o_s, T, q_offset, W, tl.maximum(lo, i_first), tl.minimum(hi, i_local),  #
            o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, True, GATED, PREC, True, BS, LOCAL,
        )
    b_dk, b_dv = _dkdv_queries(
        b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, lse, lse, lse, i_b, i_h, sqb, sqt, sqh, sdb, sdt, sdh,  #
        o_s, T, q_offset, W, tl.maximum(lo, i_local), tl.minimum(hi, mid_lo),  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, True, GATED, PREC,
    )
    b_dk, b_dv = _dkdv_queries(
        b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, lse, lse, lse, i_b, i_h, sqb, sqt, sqh, sdb, sdt, sdh,  #
        o_s, T, q_offset, W, tl.maximum(lo, mid_lo), tl.minimum(hi, mid_hi),  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, False, GATED, PREC,
    )
    b_dk, b_dv = _dkdv_queries(
        b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, lse, lse, lse, i_b, i_h, sqb, sqt, sqh, sdb, sdt, sdh,  #
        o_s, T, q_offset, W, tl.maximum(lo, mid_hi), tl.minimum(hi, i_end),  #
        o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, True, GATED, PREC,
    )
    return b_dk, b_dv


@triton.jit(do_not_specialize=["T", "TK", "q_offset", "W"])
def window_bwd_dkdv_kernel(
    q, k, v, do, gate, lse, delta, dk, dv, gate_frc, lse_frc, delta_frc,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,  #
    T, TK, q_offset, W, qk_scale, scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,  #
    BT: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,  #
    FORCED: tl.constexpr = False, BS: tl.constexpr = 1, LOCAL: tl.constexpr = 0,
    PHASED: tl.constexpr = False,
):
    """Grid ``(cdiv(TK, BN), B * H)``: ``dk [B, TK, H, DK]``, ``dv [B, TK, H, DV]``; with ``ACC``
    added to what they held (another branch's gradient of the same keys).

    Keys no query sees (past the last query, or before ``q_offset - W + 1``) get zeros.
    With ``FORCED``, also the selected branch's share over its ``LOCAL`` local blocks of ``BS``
    keys (its gate, lse and delta in ``gate_frc``/``lse_frc``/``delta_frc``): the queries that
    hold a block of this tile as a local one are the first of its band, whose scores the two
    branches share (:func:`_dkdv_queries`). The selected branch's dK/dV then
    leaves those (query, block) pairs out (``selected_bwd_dkdv(..., skip_local=LOCAL)``).
    With ``PHASED`` the band's query tiles are walked from the run of BN positions whose index is a
    multiple of the band's run count, then from the band's start up to it: the same gradients up to
    float32 summation order (:mod:`nsa.ops.window.kernel` says why).
    """
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    s0 = i_n * BN
    o_s = s0 + tl.arange(0, BN)
    m_s = o_s < TK
    o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)
    o_ks = row_offsets(i_b, o_s, i_h, skb, skt, skh)
    o_vs = row_offsets(i_b, o_s, i_h, svb, svt, svh)
    b_k = tl.load(k + o_ks[:, None] + o_dk[None, :], mask=m_s[:, None] & m_dk[None, :], other=0.0)  # [BN, BK]
    b_v = tl.load(v + o_vs[:, None] + o_dv[None, :], mask=m_s[:, None] & m_dv[None, :], other=0.0)  # [BN, BV]

    # -- query indices seeing this key tile: t in [s0, s0 + BN - 1 + W - 1] --
    i_first = tl.maximum(s0 - q_offset, 0) // BT * BT
    i_end = tl.minimum(s0 + BN - 1 + W - 1 - q_offset, T - 1) + 1
    full_lo = tl.cdiv(tl.maximum(s0 + BN - 1 - q_offset, 0), BT) * BT  # every row is past the tile's last key
    full_hi = tl.maximum(s0 + W - q_offset, 0) // BT * BT  # every row's window still holds key s0
    mid_lo, mid_hi = band(full_lo, full_hi, i_first, i_end, BT)

    b_dk = tl.zeros([BN, BK], dtype=tl.float32)
    b_dv = tl.zeros([BN, BV], dtype=tl.float32)
    i_local = i_first  # [i_first, i_local): the rows that also hold a block of this tile as a local one
    if FORCED:
        # queries up to the end of the block LOCAL - 1 past the tile's last one hold a block of it as local
        i_local = tl.minimum(((s0 + BN - 1) // BS + LOCAL) * BS - q_offset, i_end)
        i_local = tl.maximum(tl.cdiv(i_local, BT) * BT, i_first)
        mid_lo = tl.minimum(tl.maximum(mid_lo, i_local), i_end)
        mid_hi = tl.maximum(mid_hi, mid_lo)
    i_wrap = i_end  # the walk's last stretch ends here
    if PHASED:
        # The band spans `runs` runs of BN positions. Start at the run whose index (position // BN)
        # is a multiple of `runs`, and wrap: the key tiles that share a run then walk it at the same
        # time, so its q and do rows come from DRAM once and from L2 for the others. (Walked from
        # its start, tile n's band meets tile n + 1's one run later, after every running program
        # has read 1/runs of its band: more than L2 holds at 64k.)
        runs = (BN + W - 2) // BN + 1
        lead = (runs - i_n % runs) % runs
        i_split = tl.minimum(tl.maximum((s0 + lead * BN - q_offset) // BT * BT, i_first), i_end)
        b_dk, b_dv = _dkdv_span(
            b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, gate_frc, lse_frc, delta_frc, i_b, i_h,  #
            sqb, sqt, sqh, sdb, sdt, sdh, o_s, T, q_offset, W, i_split, i_end, i_first, i_local, mid_lo, mid_hi,
            i_end, o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, GATED, PREC, FORCED, BS, LOCAL,
        )
        i_wrap = i_split
    b_dk, b_dv = _dkdv_span(
        b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, gate_frc, lse_frc, delta_frc, i_b, i_h,  #
        sqb, sqt, sqh, sdb, sdt, sdh, o_s, T, q_offset, W, i_first, i_wrap, i_first, i_local, mid_lo, mid_hi,
        i_end, o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, GATED, PREC, FORCED, BS, LOCAL,
    )

    o_out = row_offsets(i_b, o_s, i_h, TK * H * DK, H * DK, DK)
    store_scaled(dk + o_out[:, None] + o_dk[None, :], b_dk, scale, m_s[:, None] & m_dk[None, :], ACC)
    o_out = row_offsets(i_b, o_s, i_h, TK * H * DV, H * DV, DV)
    store_scaled(dv + o_out[:, None] + o_dv[None, :], b_dv, 1.0, m_s[:, None] & m_dv[None, :], ACC)
