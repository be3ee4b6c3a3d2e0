"""Sliding-window attention in Triton: a banded flash attention, forward and backward.

Query ``i`` sits at position ``t = q_offset + i`` and attends to keys ``s`` with
``t - W < s <= t`` (spec: "Sliding branch")::

    key s ->      0 1 2 3 4 5 6 7        (W = 3)
    query t = 0   x . . . . . . .
          t = 1   x x . . . . . .
          t = 2   x x x . . . . .
          t = 3   . x x x . . . .
          t = 4   . . x x x . . .

Tiles: a program owns ``BT`` consecutive positions times the ``G`` query heads of
one KV head (``GP`` >= G rows per position, padding masked), so each K/V tile is
loaded once for the whole group. Key tiles are walked in three ranges: the lower
band edge and the diagonal are masked, the tiles between run unmasked.

Backward: ``dQ`` walks the same band as the forward; ``dK``/``dV`` are computed by
one program per key tile walking the query tiles that see it, all heads of the
group included, so each output element has exactly one writer (deterministic,
no atomics).

In the NSA prefill the forward and ``dQ`` kernels can also take the selected branch's
forced blocks (``FORCED``, :func:`forced_in_window`): its local blocks are the band's last
key tiles, so their scores serve both branches, and only the initial blocks cost extra
steps. That replaces the selected branch's forced-block kernels (H100, forward+backward:
8k 8.80-8.83 -> 8.32-8.36 ms, 64k 113.2-113.6 -> 110.1-110.3; docs/perf/prefill.md, session 15).
The ``dK``/``dV`` kernel takes the local blocks' share in the same way (the queries that hold
a key tile's blocks as local ones are the first of its band), which the selected branch's
inverted lists then leave out (H100: 8k 8.40-8.45 -> 8.36 ms, 64k 110.7-111.9 -> 110.7-110.8;
session 16).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from nsa import flags
from nsa.config import NSAConfig
from nsa.ops._dispatch import needs_grad
from nsa.ops.gates.kernel import gated_sum
from nsa.ops._triton.attention import (
    LOG2E,
    attn_bwd_delta,
    attn_bwd_dkdv_step,
    attn_bwd_dq_step,
    attn_bwd_ds,
    attn_fwd_finish,
    attn_fwd_step,
    check_gate,
    dot_precision,
    exact_float32_tiles,
    hopper_tiles_fit,
    last_dim_contiguous,
    load_bwd_rows,
    load_gate,
    next_pow2,
    pipeline_stages,
    row_offsets,
    store_scaled,
    wide_heads_on_small_gpu,
)
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2


@triton.jit
def _band(lo, hi, first, end, STEP: tl.constexpr):
    """Split ``[first, end)`` (``first`` a multiple of STEP) into a masked head, an
    unmasked middle ``[mid_lo, mid_hi)`` and a masked tail, where ``[lo, hi)`` are the
    STEP-aligned starts of tiles that need no mask."""
    mid_lo = tl.minimum(tl.maximum(lo, first), end)
    mid_hi = tl.minimum(tl.maximum(hi, mid_lo), end)
    return mid_lo, mid_hi


@triton.jit
def _tile_rows(i0, i_h, T, q_offset, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr):
    """Rows of a tile of ``BT`` positions from query index ``i0`` x ``GP`` heads of KV
    head ``i_h``: query index, query head, validity and absolute position, each ``[BT * GP]``."""
    o_r = tl.arange(0, BT * GP)
    o_i = i0 + o_r // GP
    m_r = (o_i < T) & (o_r % GP < G)
    return o_i, i_h * G + o_r % GP, m_r, q_offset + o_i


@triton.jit
def _key_band(i_t, T, q_offset, W, BT: tl.constexpr, BN: tl.constexpr):
    """Key tiles of query tile ``i_t``: ``(t_hi, first, mid_lo, mid_hi)``; tiles in
    ``[first, mid_lo)`` and ``[mid_hi, t_hi]`` need the band mask, the middle does not."""
    t_lo = q_offset + i_t * BT
    t_hi = tl.minimum(t_lo + BT, q_offset + T) - 1
    first = tl.maximum(t_lo - W + 1, 0) // BN * BN
    full_lo = tl.cdiv(tl.maximum(t_hi - W + 1, 0), BN) * BN  # no row's lower edge cuts these tiles
    full_hi = (t_lo + 1) // BN * BN  # tiles wholly at or before every row's diagonal
    mid_lo, mid_hi = _band(full_lo, full_hi, first, t_hi + 1, BN)
    return t_hi, first, mid_lo, mid_hi


@triton.jit
def _band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN: tl.constexpr, MASK: tl.constexpr):
    """K ``[BN, BK]`` and V ``[BN, BV]`` at keys ``s0 ...`` and, when ``MASK``, the band
    visibility ``[BM, BN]`` of rows at positions ``o_pos`` (keys past ``t_hi`` never read)."""
    o_s = s0 + tl.arange(0, BN)
    if MASK:
        m_s = o_s <= t_hi
        m_kk = m_s[:, None] & m_dk[None, :]
        m_vv = m_s[:, None] & m_dv[None, :]
        m_qk = (o_s[None, :] <= o_pos[:, None]) & (o_s[None, :] > o_pos[:, None] - W)
    else:
        m_kk = m_dk[None, :]
        m_vv = m_dv[None, :]
        m_qk = m_kk  # placeholder (a jit function cannot return None): unused without MASK
    b_k = tl.load(p_k + o_s.to(tl.int64)[:, None] * stride_kt + o_dk[None, :], mask=m_kk, other=0.0)
    b_v = tl.load(p_v + o_s.to(tl.int64)[:, None] * stride_vt + o_dv[None, :], mask=m_vv, other=0.0)
    return b_k, b_v, m_qk


@triton.jit
def _fwd_keys(
    b_q, b_acc, b_m, b_l,  #
    p_k, p_v, stride_kt, stride_vt,  #
    o_pos, t_hi, W, s_lo, s_hi, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
    BN: tl.constexpr, MASK: tl.constexpr, PREC: tl.constexpr,
):
    """Online softmax over key tiles starting at ``s_lo, s_lo + BN, ... < s_hi``."""
    for s0 in range(s_lo, s_hi, BN):
        b_k, b_v, m_qk = _band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, MASK)
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
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HQ: tl.constexpr = H * G
    BM: tl.constexpr = BT * GP
    o_i, o_hq, m_r, o_pos = _tile_rows(i_t * BT, i_h, T, q_offset, G, GP, BT)  # [BM] each
    o_dk, o_dv = tl.arange(0, BK), tl.arange(0, BV)
    m_dk, m_dv = o_dk < DK, o_dv < DV

    p_q = q + row_offsets(i_b, o_i, o_hq, sqb, sqt, sqh)[:, None] + o_dk[None, :]
    b_q = tl.load(p_q, mask=m_r[:, None] & m_dk[None, :], other=0.0)  # [BM, BK]
    p_k = k + i_b.to(tl.int64) * skb + i_h.to(tl.int64) * skh
    p_v = v + i_b.to(tl.int64) * svb + i_h.to(tl.int64) * svh

    t_hi, first, mid_lo, mid_hi = _key_band(i_t, T, q_offset, W, BT, BN)

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
            b_k, b_v, m_unused = _band_kv(p_k, p_v, skt, svt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, False)
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


@triton.jit
def _dq_keys(
    b_q, b_do, b_lse, b_delta, b_g, b_dq,  #
    p_k, p_v, stride_kt, stride_vt,  #
    o_pos, t_hi, W, s_lo, s_hi, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
    BN: tl.constexpr, MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
):
    for s0 in range(s_lo, s_hi, BN):
        b_k, b_v, m_qk = _band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, MASK)
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
        b_k, b_v, m_qk = _band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, True)
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
    ``FORCED`` (:func:`window_fwd_kernel`): the local blocks are the band's last key tiles, where
    the two branches share the scores, and each initial block left of them costs one more step."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    HQ: tl.constexpr = H * G
    BM: tl.constexpr = BT * GP
    o_i, o_hq, m_r, o_pos = _tile_rows(i_t * BT, i_h, T, q_offset, G, GP, BT)  # [BM] each
    o_dk, o_dv = tl.arange(0, BK), tl.arange(0, BV)
    m_dk, m_dv = o_dk < DK, o_dv < DV

    b_q, b_do, b_g, b_lse, b_delta, o_row = load_bwd_rows(
        q, do, gate, lse, delta, i_b, o_i, o_hq, m_r, sqb, sqt, sqh, sdb, sdt, sdh, o_dk, o_dv, m_dk, m_dv, T, HQ,
        GATED,
    )
    p_k = k + i_b.to(tl.int64) * skb + i_h.to(tl.int64) * skh
    p_v = v + i_b.to(tl.int64) * svb + i_h.to(tl.int64) * svh

    t_hi, first, mid_lo, mid_hi = _key_band(i_t, T, q_offset, W, BT, BN)

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
            b_k, b_v, m_unused = _band_kv(p_k, p_v, skt, svt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN, False)
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
        o_i, o_hq, m_r, o_pos = _tile_rows(i0, i_h, T, q_offset, G, GP, BT)
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


@triton.jit(do_not_specialize=["T", "TK", "q_offset", "W"])
def window_bwd_dkdv_kernel(
    q, k, v, do, gate, lse, delta, dk, dv, gate_frc, lse_frc, delta_frc,  #
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,  #
    T, TK, q_offset, W, qk_scale, scale,  #
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,  #
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,  #
    BT: tl.constexpr, BN: tl.constexpr, ACC: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,  #
    FORCED: tl.constexpr = False, BS: tl.constexpr = 1, LOCAL: tl.constexpr = 0,
):
    """Grid ``(cdiv(TK, BN), B * H)``: ``dk [B, TK, H, DK]``, ``dv [B, TK, H, DV]``; with ``ACC``
    added to what they held (another branch's gradient of the same keys).

    Keys no query sees (past the last query, or before ``q_offset - W + 1``) get zeros.
    With ``FORCED``, also the selected branch's share over its ``LOCAL`` local blocks of ``BS``
    keys (its gate, lse and delta in ``gate_frc``/``lse_frc``/``delta_frc``): the queries that
    hold a block of this tile as a local one are the first of its band, whose scores the two
    branches share (:func:`_dkdv_queries`). The selected branch's dK/dV then
    leaves those (query, block) pairs out (``selected_bwd_dkdv(..., skip_local=LOCAL)``).
    """
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    s0 = i_n * BN
    o_s = s0 + tl.arange(0, BN)
    m_s = o_s < TK
    o_dk, o_dv = tl.arange(0, BK), tl.arange(0, BV)
    m_dk, m_dv = o_dk < DK, o_dv < DV
    o_ks = row_offsets(i_b, o_s, i_h, skb, skt, skh)
    o_vs = row_offsets(i_b, o_s, i_h, svb, svt, svh)
    b_k = tl.load(k + o_ks[:, None] + o_dk[None, :], mask=m_s[:, None] & m_dk[None, :], other=0.0)  # [BN, BK]
    b_v = tl.load(v + o_vs[:, None] + o_dv[None, :], mask=m_s[:, None] & m_dv[None, :], other=0.0)  # [BN, BV]

    # -- query indices seeing this key tile: t in [s0, s0 + BN - 1 + W - 1] --
    i_first = tl.maximum(s0 - q_offset, 0) // BT * BT
    i_end = tl.minimum(s0 + BN - 1 + W - 1 - q_offset, T - 1) + 1
    full_lo = tl.cdiv(tl.maximum(s0 + BN - 1 - q_offset, 0), BT) * BT  # every row is past the tile's last key
    full_hi = tl.maximum(s0 + W - q_offset, 0) // BT * BT  # every row's window still holds key s0
    mid_lo, mid_hi = _band(full_lo, full_hi, i_first, i_end, BT)

    b_dk = tl.zeros([BN, BK], dtype=tl.float32)
    b_dv = tl.zeros([BN, BV], dtype=tl.float32)
    if FORCED:
        # queries up to the end of the block LOCAL - 1 past the tile's last one hold a block of it as local
        i_local = tl.minimum(((s0 + BN - 1) // BS + LOCAL) * BS - q_offset, i_end)
        i_local = tl.maximum(tl.cdiv(i_local, BT) * BT, i_first)
        b_dk, b_dv = _dkdv_queries(
            b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, gate_frc, lse_frc, delta_frc, i_b, i_h,  #
            sqb, sqt, sqh, sdb, sdt, sdh, o_s, T, q_offset, W, i_first, i_local, o_dk, o_dv, m_dk, m_dv, qk_scale,  #
            H, G, GP, BT, True, GATED, PREC, True, BS, LOCAL,
        )
        i_first = i_local
        mid_lo = tl.minimum(tl.maximum(mid_lo, i_first), i_end)
        mid_hi = tl.maximum(mid_hi, mid_lo)
    b_dk, b_dv = _dkdv_queries(
        b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, lse, lse, lse, i_b, i_h, sqb, sqt, sqh, sdb, sdt, sdh,  #
        o_s, T, q_offset, W, i_first, mid_lo, o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, True, GATED, PREC,
    )
    b_dk, b_dv = _dkdv_queries(
        b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, lse, lse, lse, i_b, i_h, sqb, sqt, sqh, sdb, sdt, sdh,  #
        o_s, T, q_offset, W, mid_lo, mid_hi, o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, False, GATED, PREC,
    )
    b_dk, b_dv = _dkdv_queries(
        b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, lse, lse, lse, i_b, i_h, sqb, sqt, sqh, sdb, sdt, sdh,  #
        o_s, T, q_offset, W, mid_hi, i_end, o_dk, o_dv, m_dk, m_dv, qk_scale, H, G, GP, BT, True, GATED, PREC,
    )

    o_out = row_offsets(i_b, o_s, i_h, TK * H * DK, H * DK, DK)
    store_scaled(dk + o_out[:, None] + o_dk[None, :], b_dk, scale, m_s[:, None] & m_dk[None, :], ACC)
    o_out = row_offsets(i_b, o_s, i_h, TK * H * DV, H * DV, DV)
    store_scaled(dv + o_out[:, None] + o_dv[None, :], b_dv, 1.0, m_s[:, None] & m_dv[None, :], ACC)


# ----------------------------------------------------------------------------- host side


#: Launch parameters of the forward (H200, bf16, D = 128, G = 16: scripts/gpu_selected_window.py).
FWD_TILES = dict(rows=64, num_warps=4, num_stages=2)


def _tiles(G: int, DK: int, DV: int, rows: int) -> dict:
    """Tile sizes: ``BT`` positions of ``GP`` head rows make about ``rows`` rows."""
    GP = next_power_of_2(G)
    return dict(GP=GP, BK=next_pow2(DK), BV=next_pow2(DV), BT=max(1, rows // GP), BN=64)


def _fwd_launch(q, k, v, window, scale, q_offset, tiles, gated, keep, forced=None):
    """``(o, lse, o_win, o_frc, lse_frc)`` of the forward kernel; see :func:`window_fwd`,
    :func:`window_fwd_summed` and, for ``forced`` (the NSA config), :func:`window_fwd_forced`."""
    B, T, HQ, DK = q.shape
    H, DV = k.shape[2], v.shape[-1]
    G = HQ // H
    cfg = dict(FWD_TILES)
    exact = exact_float32_tiles(q.dtype, q.device, max(DK, DV))
    if exact:  # its rows and warps; the 64-key tiles then spill nothing
        cfg.update(rows=exact["rows"], num_warps=exact["num_warps"])
    cfg.update(tiles or {})
    cfg = dict(_tiles(G, DK, DV, cfg.pop("rows")), **cfg)
    if forced is not None:
        cfg = _forced_tiles(cfg, forced, q_offset)
    o = torch.empty(B, T, HQ, DV, device=q.device, dtype=q.dtype)
    o_win = torch.empty_like(o) if keep else None
    lse = torch.empty(B, T, HQ, device=q.device, dtype=torch.float32) if keep or not gated else None
    o_frc, lse_frc = (torch.empty_like(o), torch.empty_like(lse)) if forced is not None else (o, lse)
    gates, o_cmp, o_slc = (x.contiguous() for x in gated) if gated else (o, o, o)
    grid = (cdiv(T, cfg["BT"]), B * H)
    window_fwd_kernel[grid](
        q, k, v, o, o if lse is None else lse, gates, o_cmp, o_slc, o if o_win is None else o_win,  #
        o_frc, o if lse_frc is None else lse_frc,  #
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],  #
        T, q_offset, window, scale * LOG2E,  #
        H=H, G=G, DK=DK, DV=DV, PREC=dot_precision(q.dtype, q.device, max(DK, DV)), GATED=gated is not None, KEEP=keep,
        FORCED=forced is not None, INIT=forced.init_blocks if forced else 0, LOCAL=forced.local_blocks if forced else 0,
        **cfg, **LAUNCH_OPTIONS,
    )
    if forced is None:
        o_frc = lse_frc = None
    return o, lse, o_win, o_frc, lse_frc


def forced_in_window(config: NSAConfig, group: int, q_offset: int) -> bool:
    """Whether :func:`window_fwd_forced` applies to ``config`` with ``group`` query heads a KV
    head: the ``NSA_FORCED_IN_WINDOW`` flag is on, ``local_blocks >= 1``, ``sel_block`` is a
    power of two from 16 to 64 (the window's key tile then), the local blocks lie inside the
    window (``window >= local_blocks * sel_block``) and ``q_offset`` is a multiple of the
    tile's positions. The caller must also know that the window and the selected branch read
    the same keys and values, and that the block lists come from the NSA selection (which
    always holds the forced blocks)."""
    bs = config.sel_block
    if not flags.get("NSA_FORCED_IN_WINDOW") or config.local_blocks < 1 or bs not in (16, 32, 64):
        return False
    # the forward's and the dQ's tiles (powers of two: the wider one's multiple suits both)
    positions = max(min(_tiles(group, 16, 16, rows)["BT"], bs)
                    for rows in (FWD_TILES["rows"], BWD_TILES["dq"]["rows"]))
    return config.window >= config.local_blocks * bs and q_offset % positions == 0


def window_fwd_forced(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: NSAConfig, scale: float, q_offset: int,
    tiles: Optional[dict] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(o, lse, o_frc, lse_frc)``: the window's output and log2-domain lse as
    :func:`window_fwd` returns them, and, from the same launch, the selected branch's
    attention over its forced blocks (``o_frc`` in q's dtype, ``lse_frc`` log2-domain
    float32), the state that :func:`nsa.ops.selected.kernel.selected_fwd` starts from
    (``start``). Only where :func:`forced_in_window` holds, with ``(k, v)`` the selected
    branch's keys and values and block lists from the NSA selection."""
    o, lse, _, o_frc, lse_frc = _fwd_launch(q, k, v, config.window, scale, q_offset, tiles, None, False, config)
    return o, lse, o_frc, lse_frc


def window_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float, q_offset: int,
    tiles: Optional[dict] = None, gated: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Launch the forward: ``o [B, T, HQ, DV]`` in q's dtype and log2-domain ``lse [B, T, HQ]`` float32.

    ``tiles`` overrides :data:`FWD_TILES` (``rows``, ``BN``, ``num_warps``, ``num_stages``).
    ``gated = (gates, o_cmp, o_slc)``: ``o`` is the gated sum of the three branches
    (:func:`nsa.ops.combine_branches`'s result, bitwise) and ``lse`` is ``None``.
    """
    return _fwd_launch(q, k, v, window, scale, q_offset, tiles, gated, False)[:2]


def window_fwd_summed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float, q_offset: int,
    gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, tiles: Optional[dict] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(o, o_win, lse)``: the gated sum of the three branches (bitwise
    :func:`nsa.ops.combine_branches`'s), and the window's own output and lse as
    :func:`window_fwd` returns them, from one launch. Training needs both; the sum then
    costs no separate pass over the three outputs."""
    o, lse, o_win = _fwd_launch(q, k, v, window, scale, q_offset, tiles, (gates, o_cmp, o_slc), True)[:3]
    return o, o_win, lse


#: Launch parameters of the backward kernels (bf16, D = 128, G = 16: dQ measured on an H200 with
#: scripts/gpu_selected_window.py). dK/dV takes 128-key tiles: each key tile re-reads q and do
#: over its whole band (W + BN positions), and at 64k those re-reads miss L2 and bound the kernel
#: by DRAM (74 %), so wider tiles read less. H100: 6.25-6.46 against 7.85-7.88 ms at 64k and 0.76
#: against 0.98 ms at 8k for 64-key tiles of 4 warps in 2 stages; 4 stages 6.6-6.7, 256-key tiles
#: 16.5, 128-key tiles with 4 warps 20.4 ms.
BWD_TILES = {"dq": dict(rows=64, num_warps=4, num_stages=2), "dkdv": dict(rows=64, BN=128, num_warps=8, num_stages=3)}
#: dK/dV tiles where :data:`BWD_TILES`' do not fit (:func:`hopper_tiles_fit`): heads wider than
#: 128, whose 128-key accumulators would not fit; float32 inputs, whose 128-key tiles in 3 stages
#: take 289 KiB of shared memory (the H100 has 227: out of resources at the launch, session 25);
#: and GPUs with less shared memory than Hopper.
SMALL_DKDV_TILES = dict(rows=64, BN=64, num_warps=4, num_stages=2)
#: dK/dV tiles for heads wider than 128 on a GPU with less than 128 KiB of shared memory a program
#: (:func:`wide_heads_on_small_gpu`): 64-key tiles ask 104 KiB even in one stage, 32-key ones
#: 76.5 KiB in two (sm_89 compiles, RTX 4090: 99).
WIDE_ON_SMALL_GPU_DKDV_TILES = dict(rows=64, BN=32, num_warps=4, num_stages=2)


def _bwd_cfg(kind: str, G: int, DK: int, DV: int, tiles: Optional[dict], dtype: torch.dtype,
             device: torch.device) -> dict:
    """Launch options of the ``kind`` (``"dq"``, ``"dkdv"``) kernel for inputs of ``dtype`` on
    ``device``, the caller's ``tiles[kind]`` over the defaults."""
    small = kind == "dkdv" and not hopper_tiles_fit(dtype, max(next_pow2(DK), next_pow2(DV)), device)
    exact = exact_float32_tiles(dtype, device, max(DK, DV))
    if exact:
        cfg = exact
    elif small and wide_heads_on_small_gpu(max(DK, DV), device):
        cfg = dict(WIDE_ON_SMALL_GPU_DKDV_TILES)
    else:
        cfg = dict(SMALL_DKDV_TILES if small else BWD_TILES[kind])
    cfg["num_stages"] = pipeline_stages(cfg["num_stages"], dtype, device, max(DK, DV), wide_heads_one_stage=kind == "dq")
    cfg.update((tiles or {}).get(kind, {}))
    return dict(_tiles(G, DK, DV, cfg.pop("rows")), **cfg)


def _forced_args(forced: Optional[dict], gate: Optional[torch.Tensor], lse: torch.Tensor, kernel: str):
    """``(gate_frc, lse_frc, delta_frc)`` kernel arguments of the selected branch's forced share
    (placeholders without ``forced``), checking that its gate comes with the window's."""
    if forced is None:
        return lse, lse, lse
    frc_gate = forced.get("gate")
    if (frc_gate is None) != (gate is None):
        raise ValueError(f"{kernel}: the selected branch's gate comes with the window's, or neither")
    return lse if frc_gate is None else frc_gate, forced["lse"], forced["delta"]


def window_bwd_dq(q, k, v, do, lse, delta, window: int, scale: float, q_offset: int, cfg: dict,
                  dq: Optional[torch.Tensor] = None, gate: Optional[torch.Tensor] = None,
                  forced: Optional[dict] = None) -> torch.Tensor:
    """Launch the ``dQ`` kernel (``delta = rowsum(o * do)`` float32 ``[B, T, HQ]``); given
    ``dq`` (contiguous, q's shape and dtype), it adds to it instead of a new tensor;
    ``gate`` and ``forced`` as in :func:`window_bwd`."""
    B, T, HQ, DK = q.shape
    H = k.shape[2]
    acc = dq is not None
    dq = dq if acc else torch.empty(B, T, HQ, DK, device=q.device, dtype=q.dtype)
    frc = dict(FORCED=False)
    if forced is not None:
        config = forced["config"]
        cfg = _forced_tiles(cfg, config, q_offset)
        frc = dict(FORCED=True, INIT=config.init_blocks, LOCAL=config.local_blocks)
    window_bwd_dq_kernel[(cdiv(T, cfg["BT"]), B * H)](
        q, k, v, do, do if gate is None else gate, lse, delta, dq, *_forced_args(forced, gate, lse, "window_bwd_dq"),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],  #
        T, q_offset, window, scale * LOG2E, scale,  #
        H=H, G=HQ // H, DK=DK, DV=v.shape[-1], ACC=acc, GATED=check_gate(gate, (B, T, HQ)),
        PREC=dot_precision(q.dtype, q.device, max(DK, v.shape[-1])), **frc, **cfg, **LAUNCH_OPTIONS,
    )
    return dq


def _forced_tiles(cfg: dict, config: NSAConfig, q_offset: int) -> dict:
    """``cfg`` with the key tiles made selection blocks and a tile's positions held in one (the
    forced blocks' condition, :func:`forced_in_window`)."""
    cfg = dict(cfg, BN=config.sel_block, BT=min(cfg["BT"], config.sel_block))
    if q_offset % cfg["BT"]:
        raise ValueError(f"forced blocks in the window kernel: q_offset={q_offset} must be a multiple of the tile's "
                         f"{cfg['BT']} positions (see forced_in_window)")
    return cfg


def window_bwd_dkdv(q, k, v, do, lse, delta, window: int, scale: float, q_offset: int, cfg: dict,
                    gate: Optional[torch.Tensor] = None, forced: Optional[dict] = None,
                    dkv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """Launch the ``dK``/``dV`` kernel: one writer per key tile, no atomics (``gate``,
    ``forced`` and ``dkv`` as in :func:`window_bwd`)."""
    B, T, HQ, DK = q.shape
    TK, H, DV = k.shape[1], k.shape[2], v.shape[-1]
    if dkv is None:
        dk = torch.empty(B, TK, H, DK, device=k.device, dtype=k.dtype)
        dv = torch.empty(B, TK, H, DV, device=v.device, dtype=v.dtype)
    else:
        dk, dv = dkv
        if dk.shape != k.shape or dv.shape != v.shape or not (dk.is_contiguous() and dv.is_contiguous()):
            raise ValueError(f"window_bwd_dkdv: dkv must be contiguous tensors shaped like k {list(k.shape)} and v "
                             f"{list(v.shape)}, got {list(dk.shape)} and {list(dv.shape)}")
    frc = dict(FORCED=False)
    if forced is not None:
        frc = dict(FORCED=True, BS=forced["config"].sel_block, LOCAL=forced["config"].local_blocks)
    window_bwd_dkdv_kernel[(cdiv(TK, cfg["BN"]), B * H)](
        q, k, v, do, do if gate is None else gate, lse, delta, dk, dv,
        *_forced_args(forced, gate, lse, "window_bwd_dkdv"),  #
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],  #
        T, TK, q_offset, window, scale * LOG2E, scale,  #
        H=H, G=HQ // H, DK=DK, DV=DV, ACC=dkv is not None, GATED=check_gate(gate, (B, T, HQ)),
        PREC=dot_precision(q.dtype, q.device, max(DK, DV)), **frc, **cfg, **LAUNCH_OPTIONS,
    )
    return dk, dv


def window_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    window: int, scale: float, q_offset: int, tiles: Optional[dict] = None,
    delta: Optional[torch.Tensor] = None, dq: Optional[torch.Tensor] = None, gate: Optional[torch.Tensor] = None,
    forced: Optional[dict] = None, dkv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward: ``(dq, dk, dv)`` shaped like ``(q, k, v)``, deterministic.

    ``tiles`` overrides :data:`BWD_TILES` per kernel, e.g. ``{"dq": {"num_warps": 8}}``.
    ``delta``: ``rowsum(o * do)`` float32 ``[B, T, HQ]`` if already computed (``o`` then
    unread); ``dq``: a gradient to add this branch's to (see :func:`window_bwd_dq`), and
    ``dkv = (dk, dv)`` likewise for the keys' and values' (contiguous, shaped like ``k``/``v``).
    ``gate [B, T, HQ]``: ``do`` is the gradient of the gated sum and this branch's is
    ``gate[..., None] * do``; the kernels scale the probabilities by the gate instead, and
    ``delta`` stays ``rowsum(o * do)`` of the ``do`` given.
    ``forced = dict(config=, lse=, delta=, gate=)``: the gradients also get the selected branch's
    share over its forced blocks (its log2-domain lse, delta and gate, the gate given with the
    window's), where :func:`window_fwd_forced` computed their forward: ``dq`` over all of them,
    ``dk``/``dv`` over the local ones. The selected branch's backward then leaves those out
    (``selected_bwd(..., forced_done=True)``).
    """
    G, DK, DV = q.shape[2] // k.shape[2], q.shape[-1], v.shape[-1]
    do = last_dim_contiguous(do)
    if delta is None:
        delta = attn_bwd_delta(o, do)  # [B, T, HQ]: rowsum(o * do) of the softmax backward
    dq = window_bwd_dq(q, k, v, do, lse, delta, window, scale, q_offset,
                       _bwd_cfg("dq", G, DK, DV, tiles, q.dtype, q.device), dq, gate, forced)
    dk, dv = window_bwd_dkdv(q, k, v, do, lse, delta, window, scale, q_offset,
                             _bwd_cfg("dkdv", G, DK, DV, tiles, q.dtype, q.device), gate, forced, dkv)
    return dq, dk, dv


class WindowAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves ``q, k, v, o, lse`` for the kernels' backward."""

    @staticmethod
    def forward(ctx, q, k, v, window: int, scale: float, q_offset: int):
        o, lse = window_fwd(q, k, v, window, scale, q_offset)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.window, ctx.scale, ctx.q_offset = window, scale, q_offset
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = window_bwd(q, k, v, o, lse, do, ctx.window, ctx.scale, ctx.q_offset)
        return dq, dk, dv, None, None, None


def window_gated_sum(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor,
    config: NSAConfig, scale: float, q_offset: int,
) -> torch.Tensor:
    """``g_cmp * o_cmp + g_slc * o_slc + g_win * o_win`` with the window branch's ``o_win``
    computed and summed in one launch: ``o_win`` never reaches memory. No backward (for
    inference: training needs ``o_win`` for the gates' gradient). Bitwise the result of
    :func:`sliding_window_attention` followed by :func:`nsa.ops.combine_branches`."""
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    if q.shape[1] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    return window_fwd(q, k, v, config.window, scale, q_offset, gated=(gates, o_cmp, o_slc))[0]


def sliding_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> torch.Tensor:
    """``[B, Tq, HQ, Dv]``: query ``t`` attends to positions ``t - w < s <= t`` (Triton).

    Same contract as :func:`nsa.ops.window.reference.sliding_window_attention`;
    inputs are float16/bfloat16/float32 with stride 1 in the last dim (copied otherwise).
    Tensors are saved for backward only when a gradient is needed.
    """
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    if q.shape[1] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    if needs_grad(q, k, v):
        return WindowAttentionFunction.apply(q, k, v, config.window, scale, q_offset)
    return window_fwd(q, k, v, config.window, scale, q_offset)[0]
