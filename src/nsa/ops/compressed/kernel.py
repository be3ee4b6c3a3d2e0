"""Attention over compressed tokens: Triton kernels (forward, backward, fused selection).

Same function as :mod:`nsa.ops.compressed.reference`. The forward lives in
:mod:`nsa.ops._triton.compressed_fwd` because block selection shares it;
:func:`compressed_attention_select` is the fused entry point that returns the
selected blocks from the same launch.

Backward, deterministic (no atomics):

- ``compressed_bwd_dq_kernel``: one program per (query tile, KV head) computes
  ``delta = rowsum(o * do) - dlse`` for its rows (saved for the next kernel)
  and ``dq`` over the visible compressed tokens;
- ``compressed_bwd_dkdv_kernel``: one program per (compressed-token tile, KV
  head) owns its ``dk``/``dv`` rows and walks every query tile that sees them.

Where the caller already has ``delta`` (training) and the memory allows, the dK/dV kernel runs
first and leaves every (query tile, token tile) pair's ``dS`` in a buffer; the dQ is then
``compressed_bwd_dq_ds_kernel``, one product a tile (``dS K``) instead of three and no softmax, the
same trade as the selected branch's (:mod:`nsa.ops.selected.kernel`). On Hopper that dK/dV (16-bit,
128-wide heads) runs as a warp-specialised Gluon kernel instead, the same function in another form
(:mod:`nsa.ops.compressed.gluon_dkdv`, flag ``NSA_GLUON_COMPRESSED_DKDV``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from nsa.config import NSAConfig
from nsa.ops._triton.attention import (
    LOG2E,
    attn_bwd_dkdv_ds_step,
    attn_bwd_dkdv_step,
    attn_bwd_dq_step,
    check_gate,
    dot_precision,
    dq_from_ds_budget,
    exact_float32_tiles,
    hopper_tiles_fit,
    load_gate,
    next_pow2,
    pipeline_stages,
    store_scaled,
    wide_heads_on_small_gpu,
)
from nsa.ops._triton.device import sm_count
from nsa.ops._triton.compressed_fwd import compressed_fwd, group_rows, visible_cmp
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2
from nsa.ops.compressed import gluon_dkdv


@triton.jit
def _load_lse2(p_lse, m_row):
    """Saved lse in the log2 domain, finite everywhere: padding rows and rows that see
    nothing read 0. Such rows are masked in every tile they meet, so exp2 never
    overflows on them and their probabilities are exactly 0."""
    b_lse = tl.load(p_lse, mask=m_row, other=0.0)
    return tl.where(b_lse == float("-inf"), 0.0, b_lse * 1.4426950408889634)


@triton.jit
def _dq_chunk(b_q, b_do, b_lse, b_delta, b_g, b_dq, p_k, p_v, i_n, n_hi, nv, qk_scale,
              BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
              HDK: tl.constexpr, HDV: tl.constexpr, MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr):
    """``dq`` += tokens ``[i_n, i_n + BN)``; p_k/p_v point at token 0 of the (batch, KV head)."""
    o_n = i_n + tl.arange(0, BN)
    o_dk = tl.arange(0, BDK)
    o_dv = tl.arange(0, BDV)
    m_n = (o_n < n_hi) | (not MASK)  # unmasked steps load whole tiles (as the forward's pass 1)
    b_k = tl.load(p_k + (o_n.to(tl.int64) * HDK)[:, None] + o_dk[None, :],
                  mask=m_n[:, None] & (o_dk < DK)[None, :], other=0.0)  # [BN, BDK]
    b_v = tl.load(p_v + (o_n.to(tl.int64) * HDV)[:, None] + o_dv[None, :],
                  mask=m_n[:, None] & (o_dv < DV)[None, :], other=0.0)  # [BN, BDV]
    m_qk = o_n[None, :] < nv[:, None]  # [M, BN]
    return attn_bwd_dq_step(b_q, b_do, b_lse, b_delta, b_g, b_k, b_v, b_dq, m_qk, qk_scale, MASK, GATED, PREC)


@triton.jit(do_not_specialize=["TQ", "NC", "q_offset"])
def compressed_bwd_dq_kernel(
    q, k, v, o, do,  # q/o/do [B, TQ, HQ, D*]; k/v [B, NC, H, D*]
    gate,  # with GATED: the branch's gates, do being the gated sum's gradient (load_gate)
    lse,  # [B, TQ, HQ] float32, natural log
    dlse,  # [B, TQ, HQ] float32, read when HAS_DLSE
    delta,  # [B, TQ, HQ] float32: written, or read with HAS_DELTA
    dq,  # [B, TQ, HQ, DK]
    TQ, NC, q_offset, qk_scale, scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
    L: tl.constexpr, S: tl.constexpr, HAS_DLSE: tl.constexpr, HAS_DELTA: tl.constexpr,
    GATED: tl.constexpr, PREC: tl.constexpr,
):
    M: tl.constexpr = BT * GP
    i_t = tl.cdiv(TQ, BT) - 1 - tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_tq, m_row, o_q = group_rows(i_b, i_t, i_h, TQ, H, G, GP, BT)
    o_dk = tl.arange(0, BDK)
    o_dv = tl.arange(0, BDV)
    m_qk_d = m_row[:, None] & (o_dk < DK)[None, :]
    m_qv_d = m_row[:, None] & (o_dv < DV)[None, :]
    b_q = tl.load(q + (o_q * DK)[:, None] + o_dk[None, :], mask=m_qk_d, other=0.0)  # [M, BDK]
    b_do = tl.load(do + (o_q * DV)[:, None] + o_dv[None, :], mask=m_qv_d, other=0.0)  # [M, BDV]
    b_g = load_gate(gate, o_q, m_row, GATED)
    if HAS_DELTA:  # rowsum(o * do) from the caller (no lse gradient)
        b_delta = tl.load(delta + o_q, mask=m_row, other=0.0)
    else:
        # -- delta = rowsum(o * do) - dlse: d(lse)/ds = p enters ds like -delta --
        b_o = tl.load(o + (o_q * DV)[:, None] + o_dv[None, :], mask=m_qv_d, other=0.0)
        b_delta = tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), 1)  # [M]
        if HAS_DLSE:
            b_delta -= tl.load(dlse + o_q, mask=m_row, other=0.0)
        tl.store(delta + o_q, b_delta, mask=m_row)
    b_lse = _load_lse2(lse + o_q, m_row)
    nv = visible_cmp(q_offset + o_tq, NC, L, S)
    n_lo = visible_cmp(q_offset + i_t * BT, NC, L, S)
    n_hi = visible_cmp(q_offset + tl.minimum(i_t * BT + BT, TQ) - 1, NC, L, S)
    p_k = k + (i_b.to(tl.int64) * NC * H + i_h) * DK
    p_v = v + (i_b.to(tl.int64) * NC * H + i_h) * DV
    b_dq = tl.zeros([M, BDK], dtype=tl.float32)
    n_full = (n_lo // BN) * BN
    for i_n in range(0, n_full, BN):
        b_dq = _dq_chunk(b_q, b_do, b_lse, b_delta, b_g, b_dq, p_k, p_v, i_n, n_hi, nv, qk_scale,
                         BN, BDK, BDV, DK, DV, H * DK, H * DV, False, GATED, PREC)
    for i_n in range(n_full, n_hi, BN):
        b_dq = _dq_chunk(b_q, b_do, b_lse, b_delta, b_g, b_dq, p_k, p_v, i_n, n_hi, nv, qk_scale,
                         BN, BDK, BDV, DK, DV, H * DK, H * DV, True, GATED, PREC)
    store_scaled(dq + (o_q * DK)[:, None] + o_dk[None, :], b_dq, scale, m_qk_d, False)


@triton.jit(do_not_specialize=["TQ", "NC", "q_offset", "TOTAL"])
def compressed_bwd_dq_ds_kernel(
    k,  # [B, NC, H, DK]
    ds, ds_off,  # the dK/dV kernel's dS^T rows (_ds_rows) and each query tile's first row
    dq,  # [B, TQ, HQ, DK]
    TQ, NC, q_offset, TOTAL, scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
    DK: tl.constexpr, BDK: tl.constexpr, L: tl.constexpr, S: tl.constexpr, PREC: tl.constexpr,
    QT: tl.constexpr = 1,
):
    """Grid ``(cdiv(query tiles, QT), B * H)``: ``dq = scale * dS K`` over the tokens that the query
    tiles see, ``dS`` read from the dK/dV kernel (``DS_OUT``) in whole ``BN``-token tiles, which that
    kernel wrote in full (``BN`` divides its token tile) with zeros where a row does not see a
    token. One product a tile instead of three, and no softmax. A program takes ``QT`` consecutive
    query tiles (of the dK/dV's ``BT`` positions) as one tile of ``QT * BT * GP`` rows, so that each
    ``K`` tile it loads serves them all; the earlier tiles' ``dS`` rows end sooner (the staircase),
    so those loads are masked by each row's visible tokens."""
    M: tl.constexpr = BT * GP
    i_t = tl.cdiv(tl.cdiv(TQ, BT), QT) - 1 - tl.program_id(0)  # the longest rows first, as the dq kernel
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_tq, m_row, o_q = group_rows(i_b, i_t, i_h, TQ, H, G, GP, BT * QT)
    o_dk = tl.arange(0, BDK)
    n_hi = visible_cmp(q_offset + tl.minimum((i_t + 1) * BT * QT, TQ) - 1, NC, L, S)
    p_k = k + (i_b.to(tl.int64) * NC * H + i_h) * DK
    if QT > 1:
        # row m belongs to query tile i_t * QT + m // M, whose dS rows start at its own offset
        o_m = tl.arange(0, QT * M)
        i_tile = i_t * QT + o_m // M
        m_tile = i_tile < tl.cdiv(TQ, BT)
        row0 = (i_b * H + i_h).to(tl.int64) * TOTAL + tl.load(ds_off + i_tile, mask=m_tile, other=0)
        nv = tl.where(m_row, visible_cmp(q_offset + o_tq, NC, L, S), 0)  # [QT * M]
    b_dq = tl.zeros([QT * M, BDK], dtype=tl.float32)
    for i_n in range(0, n_hi, BN):
        o_n = i_n + tl.arange(0, BN)
        if QT > 1:
            b_dst = tl.load(ds + ((row0[None, :] + o_n[:, None]) * M + (o_m % M)[None, :]),
                            mask=o_n[:, None] < nv[None, :], other=0.0)  # [BN, QT * M]
        else:
            b_dst = tl.load(_ds_rows(ds, ds_off, TOTAL, i_b, i_h, i_t, o_n, H, M))  # [BN, M]
        # tokens past NC meet dS = 0, but their K must not be garbage (0 * NaN)
        b_k = tl.load(p_k + (o_n.to(tl.int64) * H * DK)[:, None] + o_dk[None, :],
                      mask=(o_n < NC)[:, None] & (o_dk < DK)[None, :], other=0.0)  # [BN, BDK]
        b_dq += tl.dot(tl.trans(b_dst), b_k, input_precision=PREC)
    store_scaled(dq + (o_q * DK)[:, None] + o_dk[None, :], b_dq, scale, m_row[:, None] & (o_dk < DK)[None, :], False)


@triton.jit
def _dkdv_tile(b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, i_b, i_h, i_t, o_n, TQ, NC, q_offset, qk_scale,
               ds, ds_off, TOTAL,
               H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr,
               DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
               L: tl.constexpr, S: tl.constexpr, MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
               DS_OUT: tl.constexpr):
    """``dk``/``dv`` of tokens ``o_n [BN]`` += query tile ``i_t`` (all heads of the group); with
    ``DS_OUT`` the tile's ``dS^T [BN, M]`` also goes to ``ds`` (:func:`_ds_rows`)."""
    o_tq, m_row, o_q = group_rows(i_b, i_t, i_h, TQ, H, G, GP, BT)
    o_dk = tl.arange(0, BDK)
    o_dv = tl.arange(0, BDV)
    b_q = tl.load(q + (o_q * DK)[:, None] + o_dk[None, :], mask=m_row[:, None] & (o_dk < DK)[None, :], other=0.0)
    b_do = tl.load(do + (o_q * DV)[:, None] + o_dv[None, :], mask=m_row[:, None] & (o_dv < DV)[None, :], other=0.0)
    b_lse = _load_lse2(lse + o_q, m_row)
    b_delta = tl.load(delta + o_q, mask=m_row, other=0.0)
    b_g = load_gate(gate, o_q, m_row, GATED)
    m_kq = o_n[:, None] < visible_cmp(q_offset + o_tq, NC, L, S)[None, :]  # [BN, M]
    if DS_OUT:
        b_dk, b_dv, b_dst = attn_bwd_dkdv_ds_step(b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq,
                                                  qk_scale, MASK, GATED, PREC)
        # masked and padding entries are exact zeros (P = 0, or q = do = 0 with delta = 0): the dQ
        # reads whole tiles
        tl.store(_ds_rows(ds, ds_off, TOTAL, i_b, i_h, i_t, o_n, H, BT * GP), b_dst.to(ds.dtype.element_ty))
    else:
        b_dk, b_dv = attn_bwd_dkdv_step(b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq, qk_scale, MASK,
                                        GATED, PREC)
    return b_dk, b_dv


@triton.jit
def _ds_rows(ds, ds_off, TOTAL, i_b, i_h, i_t, o_n, H: tl.constexpr, M: tl.constexpr):
    """Pointers ``[BN, M]`` to the ``dS^T`` of tokens ``o_n`` and the ``M`` rows of query tile
    ``i_t``: per (batch, KV head), query tile ``i`` owns ``w_i`` token rows of ``M`` values from
    ``ds_off[i]`` on (:func:`ds_layout`), ``TOTAL`` rows in all."""
    o_m = tl.arange(0, M)
    row0 = (i_b * H + i_h).to(tl.int64) * TOTAL + tl.load(ds_off + i_t)
    return ds + ((row0 + o_n) * M)[:, None] + o_m[None, :]


@triton.jit(do_not_specialize=["TQ", "NC", "q_offset"])
def compressed_bwd_dkdv_kernel(
    q, k, v, do,  # q/do [B, TQ, HQ, D*]; k/v [B, NC, H, D*]
    gate,  # with GATED: the branch's gates, do being the gated sum's gradient (load_gate)
    lse, delta,  # [B, TQ, HQ] float32
    dk, dv,  # [SPLIT, B, NC, H, D*]: one partial sum per split (the outputs when SPLIT == 1)
    TQ, NC, q_offset, qk_scale, scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
    L: tl.constexpr, S: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
    ds=None, ds_off=None, TOTAL=0, DS_OUT: tl.constexpr = False,
):
    """Grid ``(token tiles, SPLIT, B * H)``. With ``DS_OUT`` every (query tile, token tile) pair
    also leaves its ``dS^T`` (gated, unscaled) in ``ds`` for :func:`compressed_bwd_dq_ds_kernel`."""
    i_n, i_s, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < NC
    o_dk = tl.arange(0, BDK)
    o_dv = tl.arange(0, BDV)
    o_kv = (i_b.to(tl.int64) * NC + o_n) * H + i_h  # [BN]
    m_nk = m_n[:, None] & (o_dk < DK)[None, :]
    m_nv = m_n[:, None] & (o_dv < DV)[None, :]
    b_k = tl.load(k + (o_kv * DK)[:, None] + o_dk[None, :], mask=m_nk, other=0.0)  # [BN, BDK]
    b_v = tl.load(v + (o_kv * DV)[:, None] + o_dv[None, :], mask=m_nv, other=0.0)  # [BN, BDV]
    b_dk = tl.zeros([BN, BDK], dtype=tl.float32)
    b_dv = tl.zeros([BN, BDV], dtype=tl.float32)
    # query tiles that see the first token, and from which on they see the whole tile
    NT = tl.cdiv(TQ, BT)
    i_lo = tl.maximum(i_n * BN * S + L - 1 - q_offset, 0) // BT
    i_full = tl.minimum(tl.cdiv(tl.maximum((i_n * BN + BN - 1) * S + L - 1 - q_offset, 0), BT), NT)
    # Split i_s takes the query tiles of chunk [i_s * seg, (i_s + 1) * seg) of the whole query range
    # that see this token tile, from the chunk's end down. The programs of one chunk (token tiles
    # vary fastest in the grid) run together and read each query tile at about the same time, so
    # most q/do reads hit L2 (H100, 64k: 12 GB read from DRAM at a 50 % L2 hit rate, against 33 GB
    # at 7 % when each token tile split its own range; the kernel's time barely moved: it is not
    # bound by DRAM, and the gain came from more, evener programs).
    seg = tl.cdiv(NT, SPLIT)
    i_a = tl.maximum(i_lo, i_s * seg)
    i_z = tl.minimum(i_s * seg + seg, NT)
    i_m = tl.maximum(i_a, i_full)  # unmasked tiles [i_m, i_z), then masked ones [i_a, min(i_z, i_full))
    for i in range(0, i_z - i_m):
        b_dk, b_dv = _dkdv_tile(b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, i_b, i_h, i_z - 1 - i, o_n, TQ, NC,
                                q_offset, qk_scale, ds, ds_off, TOTAL, H, G, GP, BT, DK, DV, BDK, BDV, L, S, False,
                                GATED, PREC, DS_OUT)
    i_u = tl.minimum(i_z, i_full)
    for i in range(0, i_u - i_a):
        b_dk, b_dv = _dkdv_tile(b_k, b_v, b_dk, b_dv, q, do, gate, lse, delta, i_b, i_h, i_u - 1 - i, o_n, TQ, NC,
                                q_offset, qk_scale, ds, ds_off, TOTAL, H, G, GP, BT, DK, DV, BDK, BDV, L, S, True,
                                GATED, PREC, DS_OUT)
    p_slot = i_s.to(tl.int64) * (tl.num_programs(2) // H) * NC * H
    tl.store(dk + (p_slot + o_kv)[:, None] * DK + o_dk[None, :], (b_dk * scale).to(dk.dtype.element_ty), mask=m_nk)
    tl.store(dv + (p_slot + o_kv)[:, None] * DV + o_dv[None, :], b_dv.to(dv.dtype.element_ty), mask=m_nv)


#: ``(rows, block_n, num_warps, num_stages)`` of the dK/dV kernel for 16-bit inputs with heads up
#: to 128 wide on GPUs with Hopper-sized shared memory; elsewhere it keeps the dq kernel's tiles.
#: ``max_splits`` caps the query chunks (programs per token tile), ``split_target`` the programs
#: per SM aimed at below the cap. Token tiles of 128 halve the passes over ``q`` and ``do``, which
#: do not fit in L2 at long lengths (H100, compressed backward: 64k 31.5-31.6 against 36.7-36.8 ms
#: for (64, 64, 4, 2) with 8 splits; 8k 0.83 against 0.93; docs/perf/prefill.md, session 9). The
#: chunks at 24 programs per SM (25 chunks at 64k; the cap binds up to 32k): 64k 30.1-31.3 against
#: 32.2-32.3 ms at 8 and 32.1-32.8 for the previous per-tile splits (session 12).
DKDV_TILES = dict(tiles=(64, 128, 8, 3), max_splits=32, split_target=24)


def _dkdv_splits(device: torch.device, programs: int, cap: int) -> int:
    """Chunks of the query range, each a program per token tile: enough programs to fill the
    GPU (a token tile near the start sees every query, so unsplit it is the critical path);
    partial sums are added in a fixed order afterwards, so the result is deterministic."""
    # the interpreter counts as one SM: small problems still split, so tests cover the reduction
    target = DKDV_TILES["split_target"] * sm_count(device)
    return max(1, min(cap, cdiv(target, max(programs, 1))))


#: The dQ from ``dS`` (:func:`compressed_bwd_dq_ds_kernel`): ``block_n`` tokens a step (it must divide
#: the dK/dV kernel's token tile, whose ``dS`` tiles it reads; by default the narrower of the two),
#: ``num_warps``, ``num_stages``, and ``query_tiles`` of the dK/dV's query tiles a program (a caller's
#: ``dq_ds`` 3-tuple means one). H100, the compressed backward as training calls it: 8k 0.712 ms
#: against 0.801 recomputing, 64k 29.09 against 30.10; (32, 4, 3) 0.701 and 30.00, (128, 4, 2) 0.760
#: and 32.44 (docs/perf/prefill.md, session 19).
DQ_DS_TILES = dict(block_n=64, num_warps=4, num_stages=3, query_tiles=1)
#: The same where :data:`DKDV_TILES` apply (:func:`hopper_tiles_fit`): two query tiles a program, so
#: that each 16 KiB ``K`` tile it loads from L2 serves two 8 KiB ``dS`` tiles (a third fewer bytes a
#: tile), in 8 warps (94 registers and 96 KiB of shared memory for sm_90: two programs an SM). H200,
#: 64k, the kernel alone in the profiler: 4.63 ms against 5.23 for one tile; 8k 0.130 against 0.141;
#: dq bitwise the same (docs/perf/prefill.md, session 57).
DQ_DS_HOPPER_TILES = dict(block_n=64, num_warps=8, num_stages=3, query_tiles=2)
#: dK/dV tiles ``(rows, block_n, num_warps, num_stages)`` for heads wider than 128 on a GPU with
#: less than 128 KiB of shared memory a program (:func:`wide_heads_on_small_gpu`): 64-token tiles
#: ask 104 KiB even in one stage, 32-token ones 76.5 KiB in two (sm_89 compiles, RTX 4090: 99).
WIDE_ON_SMALL_GPU_DKDV_TILES = (64, 32, 4, 2)


@lru_cache(maxsize=32)
def ds_layout(TQ: int, NC: int, q_offset: int, BT: int, BN: int, L: int, S: int,
              device: torch.device) -> Tuple[torch.Tensor, int]:
    """Where the compressed dK/dV kernel leaves ``dS`` (``DS_OUT``): per (batch, KV head), query
    tile ``i`` (``BT`` positions) owns the rows of the ``BN``-token tiles that it sees, ``w_i``
    token rows of ``BT * GP`` values each, from row ``offsets[i]`` on. Returns ``(offsets [NT]
    int64 on device, rows in all)``: a staircase, about half the ``[NT, NC]`` rectangle. From
    shapes alone, once per shape: the total on the host, the offsets by a few device ops (no
    copy from the host, so a first call inside CUDA-graph capture works too)."""
    host = _staircase(TQ, NC, q_offset, BT, BN, L, S, torch.device("cpu"))
    width = host if device.type == "cpu" else _staircase(TQ, NC, q_offset, BT, BN, L, S, device)
    return torch.cumsum(width, 0) - width, int(host.sum())


def _staircase(TQ: int, NC: int, q_offset: int, BT: int, BN: int, L: int, S: int,
               device: torch.device) -> torch.Tensor:
    """``[NT]`` int64: the token rows ``w_i`` of each query tile, whole ``BN``-token tiles."""
    last = q_offset + torch.clamp(torch.arange(1, cdiv(TQ, BT) + 1, dtype=torch.int64, device=device) * BT,
                                  max=TQ) - 1  # each tile's last position
    seen = torch.where(last + 1 >= L, torch.div(last + 1 - L, S, rounding_mode="floor") + 1, 0).clamp(max=NC)
    return (seen + BN - 1) // BN * BN


def compressed_bwd(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    dlse: Optional[torch.Tensor],
    config: NSAConfig,
    scale: float,
    q_offset: int,
    *,
    rows: Optional[int] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
    dkdv: Optional[Tuple[int, int, int, int]] = None,
    max_splits: Optional[int] = None,
    delta: Optional[torch.Tensor] = None,
    gate: Optional[torch.Tensor] = None,
    dq_ds: Optional[Tuple[int, ...]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk_cmp, dv_cmp)`` in the inputs' dtypes; all tensors contiguous.

    ``rows``/``block_n``/``num_warps``/``num_stages`` set the dq kernel's tiles, and the
    dK/dV kernel's where :data:`DKDV_TILES` does not apply (``rows``/``block_n``/``num_warps``
    None: 64, 64 and 4, or exact float32's own, :func:`exact_float32_tiles`; ``num_stages`` None:
    2, or 1 for float32 on tensor cores, :func:`pipeline_stages`); ``dkdv = (rows, block_n,
    num_warps, num_stages)`` sets the dK/dV kernel's alone, ``max_splits`` its query chunks.
    ``delta``: ``rowsum(o * do)`` float32 ``[B, Tq, HQ]`` already computed (then ``o`` is not
    read, and ``dlse`` must be None). With it, and where the buffer fits
    ``NSA_COMPRESSED_DQ_FROM_DS_MIB``, the dK/dV kernel runs first and leaves ``dS`` for the dQ
    (:func:`compressed_bwd_dq_ds_kernel`, tiles ``dq_ds = (block_n, num_warps, num_stages[,
    query_tiles])``, by default :data:`DQ_DS_HOPPER_TILES` where :data:`DKDV_TILES` apply, else
    :data:`DQ_DS_TILES`).
    ``gate``: ``do`` is the gradient of the gated sum, and this branch's is ``gate[..., None] * do``
    (``gate`` float32 ``[B, Tq, HQ]``, see :func:`check_gate`); ``delta`` is then ``rowsum(o * do)`` of
    that ``do``, and ``dlse`` must be None.
    """
    B, TQ, HQ, DK = q.shape
    NC, H, DV = k_cmp.shape[1], k_cmp.shape[2], v_cmp.shape[3]
    G = HQ // H
    # 64 rows, 64 tokens, 4 warps measured fastest for both kernels (docs/perf/compressed_select.md)
    GP = next_power_of_2(G)
    exact = exact_float32_tiles(q.dtype, q.device, max(DK, DV))
    defaults = exact or dict(rows=64, BN=64, num_warps=4)
    BT = max(1, (rows or defaults["rows"]) // GP)
    block_n = block_n or defaults["BN"]
    num_warps = num_warps or defaults["num_warps"]
    dq = torch.empty_like(q)
    dk = torch.empty_like(k_cmp)
    dv = torch.empty_like(v_cmp)
    has_delta = delta is not None
    if has_delta and dlse is not None:
        raise ValueError("compressed_bwd: pass delta or dlse, not both (delta would have to include dlse)")
    if gate is not None and dlse is not None:
        raise ValueError("compressed_bwd: a gate scales the output's gradient, not the lse's: pass one of gate and dlse")
    delta = delta if has_delta else torch.empty(B, TQ, HQ, dtype=torch.float32, device=q.device)
    gated = check_gate(gate, (B, TQ, HQ))
    if num_stages is None:
        num_stages = pipeline_stages(2, q.dtype, q.device, max(DK, DV), wide_heads_one_stage=True)
    common = dict(H=H, G=G, GP=GP, BT=BT, BN=block_n, DK=DK, DV=DV, BDK=next_pow2(DK), BDV=next_pow2(DV),
                  L=config.cmp_block, S=config.cmp_stride, PREC=dot_precision(q.dtype, q.device, max(DK, DV)),
                  num_warps=num_warps, num_stages=num_stages)
    kv = dict(common)
    hopper = hopper_tiles_fit(q.dtype, max(DK, DV), q.device)
    if dkdv is None and hopper:
        dkdv = DKDV_TILES["tiles"]
    elif dkdv is None and wide_heads_on_small_gpu(max(DK, DV), q.device) and not exact:
        dkdv = WIDE_ON_SMALL_GPU_DKDV_TILES
    if dkdv is not None:
        kv_rows, kv_block_n, kv_warps, kv_stages = dkdv
        kv.update(BT=max(1, kv_rows // GP), BN=kv_block_n, num_warps=kv_warps, num_stages=kv_stages)
    ds = _ds_buffer(q, k_cmp, config, q_offset, kv, dq_ds, hopper) if has_delta and B * NC * H else None
    if B * TQ * HQ and ds is None:
        compressed_bwd_dq_kernel[(cdiv(TQ, BT), B * H)](
            q, k_cmp, v_cmp, o, do, do if gate is None else gate, lse, dlse if dlse is not None else lse, delta, dq,
            TQ, NC, q_offset, scale * LOG2E, scale, HAS_DLSE=dlse is not None, HAS_DELTA=has_delta,
            GATED=gated, **common, **LAUNCH_OPTIONS)
    if B * NC * H:
        n_tiles = cdiv(NC, kv["BN"])
        split = _dkdv_splits(q.device, n_tiles * B * H, max_splits or DKDV_TILES["max_splits"])
        if split > 1:
            dk_part = torch.empty(split, *dk.shape, dtype=torch.float32, device=q.device)
            dv_part = torch.empty(split, *dv.shape, dtype=torch.float32, device=q.device)
        else:
            dk_part, dv_part = dk, dv
        if gluon_dkdv.fits(q, k_cmp, v_cmp, do, kv, ds is not None):
            gluon_dkdv.compressed_bwd_dkdv_gluon(q, k_cmp, v_cmp, do, gate, lse, delta, dk_part, dv_part, ds, TQ, NC,
                                                 q_offset, scale * LOG2E, scale, split, config.cmp_block,
                                                 config.cmp_stride)
        else:
            ds_args = dict(ds=ds["buffer"], ds_off=ds["offsets"], TOTAL=ds["total"], DS_OUT=True) if ds else {}
            compressed_bwd_dkdv_kernel[(n_tiles, split, B * H)](
                q, k_cmp, v_cmp, do, do if gate is None else gate, lse, delta, dk_part, dv_part, TQ, NC, q_offset,
                scale * LOG2E, scale, SPLIT=split, GATED=gated, **kv, **ds_args, **LAUNCH_OPTIONS)
        if split > 1:  # a reduction over a fixed axis: the same order every run
            dk.copy_(dk_part.sum(0))
            dv.copy_(dv_part.sum(0))
    if ds is not None:
        ds_bn, ds_warps, ds_stages, ds_qt = ds["tiles"]
        compressed_bwd_dq_ds_kernel[(cdiv(cdiv(TQ, kv["BT"]), ds_qt), B * H)](
            k_cmp, ds["buffer"], ds["offsets"], dq, TQ, NC, q_offset, ds["total"], scale,
            H=H, G=G, GP=GP, BT=kv["BT"], BN=ds_bn, DK=DK, BDK=next_pow2(DK), L=config.cmp_block,
            S=config.cmp_stride, PREC=common["PREC"], QT=ds_qt, num_warps=ds_warps, num_stages=ds_stages,
            **LAUNCH_OPTIONS)
    return dq, dk, dv


def _ds_buffer(q: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig, q_offset: int, kv: dict,
               tiles: Optional[Tuple[int, ...]], hopper: bool = False) -> Optional[dict]:
    """The dK/dV kernel's ``dS`` buffer for the dQ (:func:`ds_layout`), with its offsets, rows and the
    dQ's tiles (by default :data:`DQ_DS_HOPPER_TILES` with ``hopper``, else :data:`DQ_DS_TILES`); None
    where it would pass ``NSA_COMPRESSED_DQ_FROM_DS_MIB`` or the problem is empty."""
    B, TQ, HQ, _ = q.shape
    NC, H = k_cmp.shape[1], k_cmp.shape[2]
    # by default the dK/dV's token tile where it is narrower (heads wider than 128 on a small GPU)
    own = DQ_DS_HOPPER_TILES if hopper else DQ_DS_TILES
    tiles = tuple(tiles or (min(own["block_n"], kv["BN"]), own["num_warps"], own["num_stages"], own["query_tiles"]))
    tiles = tiles if len(tiles) == 4 else (*tiles, 1)
    if kv["BN"] % tiles[0]:
        raise ValueError(f"dq_ds block_n {tiles[0]} must divide the dK/dV kernel's token tile {kv['BN']}")
    budget = dq_from_ds_budget("NSA_COMPRESSED_DQ_FROM_DS_MIB", q.device)
    M = kv["BT"] * kv["GP"]
    if not B * TQ * HQ or budget == 0:
        return None
    offsets, total = ds_layout(TQ, NC, q_offset, kv["BT"], kv["BN"], config.cmp_block, config.cmp_stride, q.device)
    if total == 0 or B * H * total * M * q.element_size() > budget:
        return None
    buffer = torch.empty(B * H * total * M, device=q.device, dtype=q.dtype)
    return dict(buffer=buffer, offsets=offsets, total=total, tiles=tiles)


class CompressedAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k_cmp, v_cmp, config: NSAConfig, scale: float, q_offset: int, select: bool):
        q, k_cmp, v_cmp = q.contiguous(), k_cmp.contiguous(), v_cmp.contiguous()
        o, lse, idx = compressed_fwd(q, k_cmp, v_cmp, config, scale, q_offset, store_o=True, select=select)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            ctx.save_for_backward(q, k_cmp, v_cmp, o, lse)
        ctx.config, ctx.scale, ctx.q_offset = config, scale, q_offset
        ctx.set_materialize_grads(False)
        if idx is None:
            return o, lse
        ctx.mark_non_differentiable(idx)
        return o, lse, idx

    @staticmethod
    def backward(ctx, do, dlse, *_):
        q, k_cmp, v_cmp, o, lse = ctx.saved_tensors
        if do is None and dlse is None:
            return None, None, None, None, None, None, None
        do = torch.zeros_like(o) if do is None else do.contiguous()
        dlse = None if dlse is None else dlse.contiguous().float()
        dq, dk, dv = compressed_bwd(q, k_cmp, v_cmp, o, lse, do, dlse, ctx.config, ctx.scale, ctx.q_offset)
        return dq, dk, dv, None, None, None, None


def compressed_attention(
    q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``o [B, Tq, HQ, Dv]`` (q's dtype) and ``lse [B, Tq, HQ]`` (float32, natural log)
    over visible compressed tokens; same signature as the reference, differentiable in
    ``q``, ``k_cmp``, ``v_cmp`` (through ``o`` and ``lse``)."""
    return CompressedAttentionFunction.apply(q, k_cmp, v_cmp, config, scale, q_offset, False)


def compressed_attention_select(
    q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compressed attention and block selection from one launch.

    Equals ``(*compressed_attention(...), select_blocks(q, k_cmp, config, scale,
    q_offset))``: the second pass that scores blocks also produces ``o``, so the
    selection costs one extra ``q @ k_cmp`` instead of a separate kernel.

    Returns:
        ``(o [B, Tq, HQ, Dv], lse [B, Tq, HQ] float32, block_idx [B, Tq, H, sel_count]
        int32)``; ``o`` and ``lse`` are differentiable, ``block_idx`` is not.
    """
    return CompressedAttentionFunction.apply(q, k_cmp, v_cmp, config, scale, q_offset, True)
