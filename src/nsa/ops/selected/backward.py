"""The selected-attention backward kernels (:mod:`nsa.ops.selected.kernel` launches them): ``dQ`` from
``K`` and ``V`` or from the dK/dV kernel's ``dS``, the forced blocks' ``dQ``, and ``dK``/``dV`` over the
inverted selection with its partials summed in a fixed order."""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.ops._triton.attention import (
    attn_bwd_dkdv_ds_step,
    attn_bwd_dkdv_step,
    attn_bwd_dq_step,
    head_columns,
    kv_head_bases,
    load_bwd_rows,
    row_offsets,
    store_scaled,
)
from nsa.ops.selected.tiles import (
    block_rows,
    entry_keys,
    entry_kv,
    forced_kv,
    forced_range,
    forced_tile,
    query_tile,
    step_entry,
    step_keys,
    store_rows,
    tile_selection,
)


@triton.jit(do_not_specialize=["T", "q_offset"])
def selected_bwd_dq_kernel(
    q, k, v, block_idx, do, gate, lse, delta, dq,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,  #
    T, q_offset, qk_scale, scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BQ: tl.constexpr, ACC: tl.constexpr,  #
    GATED: tl.constexpr, PREC: tl.constexpr, d_k=None, d_v=None, KV_DESC: tl.constexpr = False,
    KEY_TILES: tl.constexpr = 1,
):
    """Grid ``(cdiv(T, BQ), B * H)``: ``dq [B, T, HQ, DK]``, the forward's tiling (``KEY_TILES``
    too); with forced blocks, adds to the share :func:`selected_forced_dq_kernel` left in ``dq``,
    and with ``ACC`` to what ``dq`` held before."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HQ: tl.constexpr = H * G
    o_i, o_hq, m_g, o_pos, o_rq = query_tile(i_t, i_h, T, q_offset, G, GP, BQ)
    o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)

    b_q, b_do, b_g, b_lse, b_delta, o_row = load_bwd_rows(
        q, do, gate, lse, delta, i_b, o_i, o_hq, m_g, sqb, sqt, sqh, sdb, sdt, sdh, o_dk, o_dv, m_dk, m_dv, T, HQ,
        GATED,
    )
    # as in the forward
    MASK: tl.constexpr = (LOCAL == 0) or (BS != BSP) or (BQ > 1)
    b_rank, b_blk, b_who, n_entries = tile_selection(block_idx, i_b, i_h, i_t, T, q_offset, H, N, NP, BQ, BS,
                                                     INIT, LOCAL)
    t_last = tl.minimum(i_t * BQ + BQ, T) - 1 + q_offset
    p_k, p_v = kv_head_bases(k, v, i_b, i_h, skb, skh, svb, svh)

    b_dq = tl.zeros([BQ * GP, BK], dtype=tl.float32)
    for i in range(n_entries * KEY_TILES):
        b_k, b_v, m_qk = entry_kv(p_k, p_v, skt, svt, b_rank, b_blk, b_who, i, t_last, o_pos, o_rq,
                                  o_dk, o_dv, m_dk, m_dv, BS, BSP, LOCAL, BQ, d_k, d_v, i_b, i_h, KV_DESC, KEY_TILES)
        b_dq = attn_bwd_dq_step(b_q, b_do, b_lse, b_delta, b_g, b_k, b_v, b_dq, m_qk, qk_scale, MASK, GATED, PREC)

    p_dq = dq + row_offsets(i_b, o_i, o_hq, T * HQ * DK, HQ * DK, DK)[:, None] + o_dk[None, :]
    store_scaled(p_dq, b_dq, scale, m_g[:, None] & m_dk[None, :], INIT + LOCAL > 0 or ACC)


@triton.jit(do_not_specialize=["T", "q_offset"])
def selected_bwd_dq_ds_kernel(
    k, block_idx, ds, dq,  #
    skb, skt, skh,  #
    T, q_offset, scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
    DK: tl.constexpr, BK: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr, d_k=None, KV_DESC: tl.constexpr = False,
    KEY_TILES: tl.constexpr = 1,
):
    """Grid ``(T, B * H)``: ``dq [B, T, HQ, DK]`` as :func:`selected_bwd_dq_kernel` (one query
    position a program, ``KEY_TILES`` as there), from the ``dS`` that
    :func:`selected_bwd_dkdv_kernel` left in ``ds [B, T, H, N, G, BS]``: ``dq = scale * sum dS K``
    over the entries, with no softmax and no V."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HQ: tl.constexpr = H * G
    o_i, o_hq, m_g, _, _ = query_tile(i_t, i_h, T, q_offset, G, GP, 1)
    o_dk = tl.arange(0, BK)
    m_dk = o_dk < DK
    o_g, o_c, o_e = tl.arange(0, GP), tl.arange(0, BSP), tl.arange(0, NP)
    b_rank, b_blk, _, n_entries = tile_selection(block_idx, i_b, i_h, i_t, T, q_offset, H, N, NP, 1, BS, INIT, LOCAL)
    p_k = k + i_b.to(tl.int64) * skb + i_h.to(tl.int64) * skh
    p_ds = ds + ((i_b.to(tl.int64) * T + i_t) * H + i_h) * N * G * BS
    m_ds = (o_g < G)[:, None] & (o_c < BS)[None, :]
    b_dq = tl.zeros([GP, BK], dtype=tl.float32)
    for i in range(n_entries * KEY_TILES):
        o_t = step_keys(i, BSP, KEY_TILES)
        e = step_entry(i, KEY_TILES)
        blk, o_s, m_s = entry_keys(b_rank, b_blk, e, o_t, q_offset + i_t, BS, LOCAL)
        b_k = block_rows(p_k, skt, d_k, blk, o_s, m_s, o_dk, m_dk, i_b, i_h, BS, BSP, LOCAL, KV_DESC)
        n = tl.sum(tl.where(b_rank == e, o_e, 0), 0)  # the entry's place in the query's list
        if KEY_TILES == 1:  # the whole block's columns of dS, their mask the same every step
            b_ds = tl.load(p_ds + (n * G + o_g)[:, None] * BS + o_c[None, :], mask=m_ds, other=0.0)  # [GP, BSP]
        else:  # the tile's
            b_ds = tl.load(p_ds + (n * G + o_g)[:, None] * BS + o_t[None, :], mask=(o_g < G)[:, None] & (o_t < BS)[None, :],
                           other=0.0)
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=PREC)
    p_dq = dq + row_offsets(i_b, o_i, o_hq, T * HQ * DK, HQ * DK, DK)[:, None] + o_dk[None, :]
    store_scaled(p_dq, b_dq, scale, m_g[:, None] & m_dk[None, :], INIT + LOCAL > 0 or ACC)


@triton.jit(do_not_specialize=["T", "q_offset"])
def selected_forced_dq_kernel(
    q, k, v, block_idx, do, gate, lse, delta, dq,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,  #
    T, q_offset, qk_scale, scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, ACC: tl.constexpr,  #
    GATED: tl.constexpr, PREC: tl.constexpr, KEY_TILES: tl.constexpr = 1,
):
    """Grid ``(cdiv(T, BT), B * H)``: the forced blocks' share of ``dq`` (added to what ``dq``
    held with ``ACC``), written for :func:`selected_bwd_dq_kernel` to add the rest to
    (``KEY_TILES`` as there)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HQ: tl.constexpr = H * G
    o_i, o_hq, m_r, o_pos, o_j, b_list = forced_tile(block_idx, i_b, i_h, i_t, T, q_offset, H, G, GP, BT, N, NP, BS)
    o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)
    b_q, b_do, b_g, b_lse, b_delta, o_row = load_bwd_rows(
        q, do, gate, lse, delta, i_b, o_i, o_hq, m_r, sqb, sqt, sqh, sdb, sdt, sdh, o_dk, o_dv, m_dk, m_dv, T, HQ,
        GATED,
    )
    p_k, p_v = kv_head_bases(k, v, i_b, i_h, skb, skh, svb, svh)
    j_lo = (q_offset + i_t * BT) // BS
    j_hi = (tl.minimum(q_offset + i_t * BT + BT, q_offset + T) - 1) // BS

    b_dq = tl.zeros([BT * GP, BK], dtype=tl.float32)
    l_lo, n_forced = forced_range(j_lo, j_hi, INIT, LOCAL)
    for i in range(n_forced * KEY_TILES):
        b_k, b_v, m_qk = forced_kv(p_k, p_v, skt, svt, b_list, i, l_lo, o_j, o_pos, m_r, o_dk, o_dv, m_dk, m_dv, BS, BSP,
                                   INIT, LOCAL, KEY_TILES)
        b_dq = attn_bwd_dq_step(b_q, b_do, b_lse, b_delta, b_g, b_k, b_v, b_dq, m_qk, qk_scale, True, GATED, PREC)

    p_dq = dq + row_offsets(i_b, o_i, o_hq, T * HQ * DK, HQ * DK, DK)[:, None] + o_dk[None, :]
    store_scaled(p_dq, b_dq, scale, m_r[:, None] & m_dk[None, :], ACC)


@triton.jit(do_not_specialize=["T", "TK", "q_offset", "NB", "NBHJ"])
def selected_bwd_dkdv_kernel(
    q, k, v, do, gate, lse, delta, dk, dv, dk_part, dv_part,  #
    t_sorted, starts, counts, seg_first, seg_count, seg_owner,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,  #
    T, TK, q_offset, NB, NBHJ, qk_scale, scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,  #
    BQ: tl.constexpr, QSEG: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,  #
    n_sorted=None, ds=None, N: tl.constexpr = 1, DS_OUT: tl.constexpr = False, CAUSAL: tl.constexpr = True,
    KEY_TILES: tl.constexpr = 1,
):
    """Grid ``(S,)``, one program per segment of a (batch, KV head, block) owner.

    An owner with one segment writes ``dk``/``dv`` directly; otherwise each segment
    writes float32 partials to ``dk_part``/``dv_part [S, BSP, BK|BV]`` for
    :func:`selected_bwd_reduce_kernel`. Programs past the last segment do nothing.
    With ``DS_OUT`` every (query, block) pair also leaves its ``dS [G, BS]`` (gated, unscaled)
    in ``ds [B, T, H, N, G, BS]`` at the entry's place in the query's list (``n_sorted``),
    for :func:`selected_bwd_dq_ds_kernel`. ``CAUSAL`` False: the lists hold no block that
    reaches its query (each query's own block is left out, ``skip_local``), so no key needs
    the causal mask. ``KEY_TILES`` > 1: the program walks its queries once for each tile of
    ``BSP // KEY_TILES`` keys of the block (:func:`~nsa.ops.selected.tiles.step_keys`), whose
    rows of ``dK``/``dV`` depend on no other tile's keys.
    """
    i_p = tl.program_id(0)
    i_o = tl.load(seg_owner + i_p)
    if i_o < NBHJ:
        i_b, i_h, i_j = i_o // (H * NB), (i_o // NB) % H, i_o % NB
        HQ: tl.constexpr = H * G
        BM: tl.constexpr = BQ * GP
        i_start = tl.load(starts + i_o)
        e_lo = i_start + (i_p - tl.load(seg_first + i_o)) * QSEG
        e_hi = tl.minimum(e_lo + QSEG, i_start + tl.load(counts + i_o))
        for part in tl.static_range(KEY_TILES):
            o_c = step_keys(part, BSP, KEY_TILES)  # the tile's keys in the block
            o_s = i_j * BS + o_c  # [BSP // KEY_TILES] their positions
            m_s = (o_c < BS) & (o_s < TK)
            o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)
            b_k = tl.load(k + row_offsets(i_b, o_s, i_h, skb, skt, skh)[:, None] + o_dk[None, :], mask=m_s[:, None] & m_dk[None, :], other=0.0)  # [BKT, BK]
            b_v = tl.load(v + row_offsets(i_b, o_s, i_h, svb, svt, svh)[:, None] + o_dv[None, :], mask=m_s[:, None] & m_dv[None, :], other=0.0)  # [BKT, BV]

            o_r = tl.arange(0, BM)
            o_hq = i_h * G + o_r % GP
            b_dk = tl.zeros([BSP // KEY_TILES, BK], dtype=tl.float32)
            b_dv = tl.zeros([BSP // KEY_TILES, BV], dtype=tl.float32)
            for e in range(e_lo, e_hi, BQ):
                # -- BQ queries of the list, G head rows each --
                m_r = (e + o_r // GP < e_hi) & (o_r % GP < G)
                o_i = tl.load(t_sorted + e + o_r // GP, mask=m_r, other=0)  # [BM] query index of each row
                b_q, b_do, b_g, b_lse, b_delta, o_row = load_bwd_rows(
                    q, do, gate, lse, delta, i_b, o_i, o_hq, m_r, sqb, sqt, sqh, sdb, sdt, sdh, o_dk, o_dv, m_dk, m_dv, T, HQ,
                    GATED,
                )
                # read only with CAUSAL; without it, padding rows add zero (q = do = 0) and are not stored
                m_kq = (o_s[:, None] <= q_offset + o_i[None, :]) & m_r[None, :]  # [BSP, BM]
                if DS_OUT:
                    b_dk, b_dv, b_dst = attn_bwd_dkdv_ds_step(b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq,
                                                              qk_scale, CAUSAL, GATED, PREC)
                    # every pair's, forced blocks' too, which the dQ does not read: masking those out slowed
                    # the kernel more than their stores cost (H200, 8k: 1.91 ms, 2.05 by a branch, against 1.67)
                    o_n = tl.load(n_sorted + e + o_r // GP, mask=m_r, other=0)  # [BM] the entry's place in its list
                    o_ds = (((i_b.to(tl.int64) * T + o_i) * H + i_h) * N + o_n) * G + o_r % GP  # [BM] rows of [.., G, BS]
                    if CAUSAL:
                        # dS is 0 past each row's query, also where V holds NaN there (an unwritten cache tail)
                        b_dst = tl.where(m_kq, b_dst, 0.0)
                    tl.store(ds + o_ds[None, :] * BS + o_c[:, None], b_dst.to(ds.dtype.element_ty),
                             mask=m_r[None, :] & (o_c < BS)[:, None])
                else:
                    b_dk, b_dv = attn_bwd_dkdv_step(b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq, qk_scale,
                                                    CAUSAL, GATED, PREC)

            if tl.load(seg_count + i_o) == 1:
                o_kd = row_offsets(i_b, o_s, i_h, TK * H * DK, H * DK, DK)
                tl.store(dk + o_kd[:, None] + o_dk[None, :], (b_dk * scale).to(dk.dtype.element_ty), mask=m_s[:, None] & m_dk[None, :])
                o_vd = row_offsets(i_b, o_s, i_h, TK * H * DV, H * DV, DV)
                tl.store(dv + o_vd[:, None] + o_dv[None, :], b_dv.to(dv.dtype.element_ty), mask=m_s[:, None] & m_dv[None, :])
            else:
                m_all = o_c < BSP
                store_rows(dk_part + i_p.to(tl.int64) * BSP * BK, b_dk, o_c, o_dk, m_all, o_dk < BK, BK)
                store_rows(dv_part + i_p.to(tl.int64) * BSP * BV, b_dv, o_c, o_dv, m_all, o_dv < BV, BV)


@triton.jit(do_not_specialize=["TK", "NB"])
def selected_bwd_reduce_kernel(
    dk, dv, dk_part, dv_part, seg_first, seg_count,  #
    TK, NB, scale,  #
    H: tl.constexpr, BS: tl.constexpr, BSP: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """Grid ``(B * H * NB,)``: owners with 0 or several segments; sums partials in order
    (zeros for a block no query chose). Owners with one segment are already written."""
    i_o = tl.program_id(0)
    n_seg = tl.load(seg_count + i_o)
    if n_seg != 1:
        i_b, i_h, i_j = i_o // (H * NB), (i_o // NB) % H, i_o % NB
        i_first = tl.load(seg_first + i_o)
        o_c = tl.arange(0, BSP)
        o_dk, o_dv, m_dk, m_dv = head_columns(DK, DV, BK, BV)
        b_dk = tl.zeros([BSP, BK], dtype=tl.float32)
        b_dv = tl.zeros([BSP, BV], dtype=tl.float32)
        p_dk = dk_part + i_first.to(tl.int64) * BSP * BK + o_c[:, None] * BK + o_dk[None, :]
        p_dv = dv_part + i_first.to(tl.int64) * BSP * BV + o_c[:, None] * BV + o_dv[None, :]
        for _ in range(n_seg):  # segments in order: a fixed summation order
            b_dk += tl.load(p_dk)
            b_dv += tl.load(p_dv)
            p_dk += BSP * BK
            p_dv += BSP * BV
        o_s = i_j * BS + o_c
        m_s = (o_c < BS) & (o_s < TK)
        o_kd = row_offsets(i_b, o_s, i_h, TK * H * DK, H * DK, DK)
        tl.store(dk + o_kd[:, None] + o_dk[None, :], (b_dk * scale).to(dk.dtype.element_ty), mask=m_s[:, None] & m_dk[None, :])
        o_vd = row_offsets(i_b, o_s, i_h, TK * H * DV, H * DV, DV)
        tl.store(dv + o_vd[:, None] + o_dv[None, :], b_dv.to(dv.dtype.element_ty), mask=m_s[:, None] & m_dv[None, :])
