"""Device helpers shared by the decode launches: a query row's position and visible compressed
tokens, the group's queries, the online softmax over a range of key/value tiles (plain loads or
tensor descriptors; a compressed range also leaves what scoring needs, :mod:`.sink`), and one
split's partial ``(acc, max, sum)`` for the combine launch."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from nsa.ops._triton.attention import token_tile
from nsa.ops.decode.sink import store_scores


@triton.jit
def row_position(seq_lens, i_r, TQ: tl.constexpr):
    """Sequence index and absolute position of query row ``i_r``."""
    i_b = i_r // TQ
    pos = tl.load(seq_lens + i_b).to(tl.int64) - TQ + i_r % TQ
    return i_b.to(tl.int64), pos


@triton.jit
def row_group_program(q, seq_lens, s_qr, s_qh, TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr,
                      BG: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    """The start of a program of the compressed or selected launch (grid ``(splits, rows * H)``):
    with ``PDL`` it first lets the next launch start; returns its split ``i_s``, row ``i_r``, KV
    head ``i_h``, sequence ``i_b``, position ``pos`` and the group's queries ``[BG, BK]``."""
    if PDL:
        gdc_launch_dependents()
    i_s, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    i_b, pos = row_position(seq_lens, i_r, TQ)
    return i_s, i_r, i_h, i_b, pos, _load_group_q(q, i_r, i_h, s_qr, s_qh, G, K, BG, BK)


@triton.jit
def visible_cmp(pos, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr):
    """Spec ``Nc(t)``: compressed tokens whose whole block lies at or before ``pos``."""
    return tl.where(pos + 1 >= CMP_BLOCK, (tl.maximum(pos + 1 - CMP_BLOCK, 0)) // CMP_STRIDE + 1, 0)


@triton.jit
def window_split(pos, i_w, S_WIN, WINDOW: tl.constexpr):
    """Tokens ``[lo, hi)`` of window split ``i_w`` of ``S_WIN`` equal parts of ``pos - w < s <= pos``."""
    w_chunk = (WINDOW + S_WIN - 1) // S_WIN
    lo = tl.maximum(pos + 1 - WINDOW, 0) + i_w * w_chunk
    return lo, tl.minimum(lo + w_chunk, pos + 1)


@triton.jit
def _load_group_q(q, i_r, i_h, s_qr, s_qh, G: tl.constexpr, K: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr):
    o_g = tl.arange(0, BG)
    o_k = tl.arange(0, BK)
    p_q = q + i_r.to(tl.int64) * s_qr + (i_h * G + o_g[:, None]).to(tl.int64) * s_qh + o_k[None, :]
    return tl.load(p_q, mask=(o_g[:, None] < G) & (o_k[None, :] < K), other=0.0)  # [BG, BK]


@triton.jit
def _load_kv_tile(p_k, p_v, s_kt, s_vt, i0, hi, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr):
    """Keys ``[BC, BK]`` and values ``[BC, BV]`` of tokens ``[i0, i0 + BC)``, zero at and past ``hi``."""
    o_t = i0 + tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_t = o_t < hi
    b_k = tl.load(p_k + o_t[:, None].to(tl.int64) * s_kt + o_k[None, :], mask=m_t[:, None] & (o_k[None, :] < K), other=0.0)
    b_v = tl.load(p_v + o_t[:, None].to(tl.int64) * s_vt + o_v[None, :], mask=m_t[:, None] & (o_v[None, :] < V), other=0.0)
    return b_k, b_v


@triton.jit
def online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC: tl.constexpr):
    """One tile of the online softmax (log2 units): logits ``b_s [BG, BC]`` (``-inf`` where
    masked) and values ``b_v [BC, BV]`` into the running max ``b_m``, sum ``b_l`` and
    ``b_acc``. A fully masked tile leaves the state as it was: its max is taken as 0 for
    the exponentials."""
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))
    b_ref = tl.where(b_mn == float("-inf"), 0.0, b_mn)
    b_alpha = tl.exp2(b_m - b_ref)
    b_p = tl.exp2(b_s - b_ref[:, None])  # [BG, BC]
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC)  # [BG, BV]
    return b_mn, b_l, b_acc


@triton.jit
def attend_range(
    b_q, p_k, p_v, s_kt, s_vt, lo, hi,  #
    b_m, b_l, b_acc, qk_scale,  #
    p_s, s_sg,  #
    G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,  #
    STORE_S: tl.constexpr, PREC: tl.constexpr, KEEP: tl.constexpr,  #
    R: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,
):
    """Online softmax of the group's queries over tokens ``[lo, hi)`` (log2 units).

    ``b_m [BG]`` running max, ``b_l [BG]`` running sum, ``b_acc [BG, BV]``; with
    ``STORE_S`` 1 or 2 every tile leaves its logits or its block masses in ``p_s`` (head
    stride ``s_sg``, L2 eviction policy ``KEEP``; :func:`~nsa.ops.decode.sink.store_scores`, geometry ``R``,
    ``CMP_*``, ``SEL_BLOCK``).
    Keys and values of a tile are requested together, before the math on either. Triton 3.6
    pipelines the loop on sm_90: in ``num_stages`` 3 its ``cp.async`` copies run two tiles
    ahead (the batch-1 compressed kernel: 135 KiB of shared memory, ``scripts/sass_decode.sh
    cmp b1``); in one stage the loads go straight to registers. (Requesting the next tile an
    iteration ahead by hand measured slower: it spilled at 4 warps.)
    """
    for i0 in range(lo, hi, BC):
        o_t = i0 + tl.arange(0, BC)
        m_t = o_t < hi
        b_k, b_v = _load_kv_tile(p_k, p_v, s_kt, s_vt, i0, hi, K, V, BK, BV, BC)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BG, BC]
        b_s = tl.where(m_t[None, :], b_s, float("-inf"))
        if STORE_S != 0:
            store_scores(b_s, b_m, i0, m_t, p_s, s_sg, G, BG, BC, STORE_S, KEEP, R, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK)
        b_m, b_l, b_acc = online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC)
    return b_m, b_l, b_acc


@triton.jit
def attend_full_tiles_desc(
    b_q, d_k, d_v, i_b, i_h, lo, hi,  #
    b_m, b_l, b_acc, qk_scale, p_s, s_sg,  #
    G: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,  #
    STORE_S: tl.constexpr, PREC: tl.constexpr, KEEP: tl.constexpr,  #
    R: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,
):
    """:func:`attend_range` over the whole tiles ``[lo, hi)`` (``hi - lo`` a multiple of
    ``BC``), keys and values read through the tensor descriptors ``d_k``/``d_v`` of a
    ``[B, T, H, D]`` cache: one bulk copy (TMA) a tile, issued stages ahead, where
    :func:`attend_range`'s pipelined copies are per thread, with their address arithmetic
    and masks. Every tile is whole, so nothing is masked."""
    i_b, i_h = i_b.to(tl.int32), i_h.to(tl.int32)  # descriptor offsets are 32-bit
    for i0 in range(lo.to(tl.int32), hi.to(tl.int32), BC):
        o_t = i0 + tl.arange(0, BC)
        b_k = token_tile(d_k, i_b, i0, i_h, BC, BK)
        b_v = token_tile(d_v, i_b, i0, i_h, BC, BV)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BG, BC]
        if STORE_S != 0:
            store_scores(b_s, b_m, i0, o_t >= 0, p_s, s_sg, G, BG, BC, STORE_S, KEEP, R, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK)
        b_m, b_l, b_acc = online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC)
    return b_m, b_l, b_acc


@triton.jit
def store_partial(o_part, m_part, l_part, i_r, i_h, slot, S, b_m, b_l, b_acc,  #
                  HQ: tl.constexpr, G: tl.constexpr, V: tl.constexpr, BG: tl.constexpr, BV: tl.constexpr,
                  KEEP: tl.constexpr):
    """Write one split's ``(acc [BG, BV], max [BG], sum [BG])`` for the group's heads
    (L2 eviction policy ``KEEP``)."""
    o_g = tl.arange(0, BG)
    o_v = tl.arange(0, BV)
    m_g = o_g < G
    i_rq = (i_r * HQ + i_h * G + o_g).to(tl.int64)  # [BG] global head rows
    tl.store(m_part + i_rq * S + slot, b_m, mask=m_g, eviction_policy=KEEP)
    tl.store(l_part + i_rq * S + slot, b_l, mask=m_g, eviction_policy=KEEP)
    p_o = o_part + (i_rq[:, None] * S + slot) * V + o_v[None, :]
    tl.store(p_o, b_acc, mask=m_g[:, None] & (o_v[None, :] < V), eviction_policy=KEEP)
