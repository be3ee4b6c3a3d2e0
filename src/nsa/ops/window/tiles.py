"""Device helpers of the sliding-window kernels: a program's rows, the key tiles of its band and
the walk of a band in steps, and one key/value tile of it."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def band(lo, hi, first, end, STEP: tl.constexpr):
    """Split ``[first, end)`` (``first`` a multiple of STEP) into a masked head, an
    unmasked middle ``[mid_lo, mid_hi)`` and a masked tail, where ``[lo, hi)`` are the
    STEP-aligned starts of tiles that need no mask."""
    mid_lo = tl.minimum(tl.maximum(lo, first), end)
    mid_hi = tl.minimum(tl.maximum(hi, mid_lo), end)
    return mid_lo, mid_hi


@triton.jit
def tile_rows(i0, i_h, T, q_offset, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr):
    """Rows of a tile of ``BT`` positions from query index ``i0`` x ``GP`` heads of KV
    head ``i_h``: query index, query head, validity and absolute position, each ``[BT * GP]``."""
    o_r = tl.arange(0, BT * GP)
    o_i = i0 + o_r // GP
    m_r = (o_i < T) & (o_r % GP < G)
    return o_i, i_h * G + o_r % GP, m_r, q_offset + o_i


@triton.jit
def query_tile_program(T, q_offset, H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr):
    """The start of a program over a query tile (grid ``(cdiv(T, BT), B * H)``): its tile
    ``i_t``, sequence ``i_b``, KV head ``i_h`` and the tile's rows (:func:`tile_rows`):
    ``(i_t, i_b, i_h, o_i, o_hq, m_r, o_pos)``."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_i, o_hq, m_r, o_pos = tile_rows(i_t * BT, i_h, T, q_offset, G, GP, BT)  # [BT * GP] each
    return i_t, i_b, i_h, o_i, o_hq, m_r, o_pos


@triton.jit
def key_band(i_t, T, q_offset, W, BT: tl.constexpr, BN: tl.constexpr):
    """Key tiles of query tile ``i_t``: ``(t_hi, first, mid_lo, mid_hi)``; tiles in
    ``[first, mid_lo)`` and ``[mid_hi, t_hi]`` need the band mask, the middle does not."""
    t_lo = q_offset + i_t * BT
    t_hi = tl.minimum(t_lo + BT, q_offset + T) - 1
    first = tl.maximum(t_lo - W + 1, 0) // BN * BN
    full_lo = tl.cdiv(tl.maximum(t_hi - W + 1, 0), BN) * BN  # no row's lower edge cuts these tiles
    full_hi = (t_lo + 1) // BN * BN  # tiles wholly at or before every row's diagonal
    mid_lo, mid_hi = band(full_lo, full_hi, first, t_hi + 1, BN)
    return t_hi, first, mid_lo, mid_hi


@triton.jit
def band_kv(p_k, p_v, stride_kt, stride_vt, s0, o_pos, t_hi, W, o_dk, o_dv, m_dk, m_dv, BN: tl.constexpr, MASK: tl.constexpr):
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
