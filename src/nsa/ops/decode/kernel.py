"""Triton decode: one (or a few) new tokens per sequence over a KV cache, four launches.

Every program works on one query row (sequence ``b``, new token ``i``) and one KV
group, so each key/value tile it loads serves the group's ``G`` query heads in
one ``tl.dot``. Positions come from the device tensor ``seq_lens``; grids and
buffers depend only on shapes, so a captured CUDA graph replays at any length.

1. ``decode_cmp_win_fwd_kernel``: grid ``(S_CMP + S_WIN, rows * H)``. Split-K
   over the visible compressed tokens (the split size follows the length at run
   time) and over the window; each split writes a partial ``(acc, max, sum)``,
   and the compressed splits also write their log2-scaled logits, or, once the batch
   fills the GPU, each tile's block masses (a quarter of the bytes). Once the batch
   fills the GPU, or while a row holds at most 128 selection blocks, the window's
   splits move to launch 3 and the grid is ``(S_CMP, rows * H)``.
2. ``decode_score_kernel``: grid ``(block tiles, rows * H)``. Merges the
   compressed splits into each head's log-sum-exp, turns the logits into
   probabilities, sums them over the group and maps them onto selection blocks
   with the mass-conserving overlap weights (spec Eqs. 8-10); from block masses it
   only rescales and sums them. Each program keeps
   its tile's scores in registers and writes only the tile's ``n`` best block
   keys (its candidates, found by one all-pairs rank in the tile, not ``n`` rounds); where
   launch 3 merges them, at their ranks: a sorted run, largest first in even tiles and last
   in odd ones. On a GPU each head's log-sum-exp takes the special-function unit's log2.
   It compiles without FMA fusion (``UNFUSED_LAUNCH_OPTIONS``): the rank compares each key
   with its tile's keys as other lanes hold them, and fused sums across lanes could leave a
   key's copies a bit apart, so that it outranked itself.
3. ``decode_selected_fwd_kernel``: grid ``(S_SLC, rows * H)``, or ``(S_SLC + S_WIN,
   rows * H)`` with the window's splits (which wait for nothing). Every selection program
   finds the n largest keys among the candidates (forced blocks first, ties to
   the lower index: spec Eq. 11), attends over its share of the selected blocks,
   and the first one writes ``block_idx``. Where the candidates fit one tile, one
   bitonic merge of the tiles' sorted runs finds them (:func:`_top_of_sorted_runs`; 1720
   against 2272 SASS instructions a batch-1 program with ``tl.topk`` over the unsorted
   candidates); otherwise rounds find the n-th largest
   key (each round the largest keys below the last round's smallest). When one
   score tile holds a whole row, its candidates are the top-n and nothing is ranked.
   (Counting, for each candidate, the larger ones instead of rounds of maxima measured
   slower on an H200: 34 us against 29 us at batch 1, 64k; rounds of 4 maxima, the
   default until session 21, 25.6 us against 23.6-23.8 for the top-k on an H100.)
4. ``decode_combine_kernel``: grid ``(rows * HQ,)``. Merges the partials of each
   branch, a chunk of splits at a time, and applies the gates (or computes them first from the
   hidden state, given a :class:`~nsa.ops.gates.projection.GateProjection`).

On Hopper and later, launches 2-4 use programmatic dependent launch (PDL): each starts
while the one before it runs, does the work that needs nothing from it (positions, query,
gates), then waits for it with ``gdc_wait``; the window's programs of launch 3 need nothing
and do not wait. Every other program of every PDL launch waits, so a launch's end implies
the end of all launches before it. Once the batch fills the GPU, launches 1 and 3 read the
compressed keys and values and the selected blocks through tensor descriptors: bulk copies
into shared memory that the compiler issues stages ahead (see :func:`decode_fwd` for the
timings). Logits and partials, written by one launch and read by the next, carry L2
eviction hints (stored evict-last, read once evict-first).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, libdevice
from triton.runtime.jit import constexpr_function

from nsa.config import NSAConfig
from nsa.ops._triton.attention import (
    LOG2E,
    descriptor_ready,
    dot_precision,
    exact_float32,
    last_dim_contiguous,
    next_pow2,
    pipeline_stages,
    token_tile_descriptor,
)
from nsa.ops._triton.device import bulk_copies_supported, min_dot_side, pdl_supported, sm_count
from nsa.ops._triton.launch import LAUNCH_OPTIONS, UNFUSED_LAUNCH_OPTIONS, cdiv, next_power_of_2, pdl_launch
from nsa.ops.gates.projection import GateProjection

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
def _window_split(pos, i_w, S_WIN, WINDOW: tl.constexpr):
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
def _online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC: tl.constexpr):
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
def _mass_row_sections(s_sg, NBT: tl.constexpr):
    """Offsets of the max and tail sections of a block-mass row of ``s_sg`` floats, laid out
    ``[mass (NT*NBT) | max (NT) | tail (NT)]`` for ``NT`` tiles of ``NBT`` blocks."""
    n_tiles = s_sg // (NBT + 2)
    return n_tiles * NBT, n_tiles * (NBT + 1)


@triton.jit
def _store_block_mass(b_p, b_ref, i0, p_s, s_sg, G: tl.constexpr, BG: tl.constexpr, BC: tl.constexpr, R: tl.constexpr,
                      CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr, KEEP: tl.constexpr):
    """Each head's selection-block masses of one tile of compressed tokens ``[i0, i0 + BC)``
    (probabilities ``b_p [BG, BC]`` relative to the running max ``b_ref`` after the tile:
    spec Eqs. 9-10 before the sum over heads and the division by the head's total), written
    in place of the tile's logits.

    Block ``j`` starts at token ``j*R`` (``R = l'/d``); token ``j*R + r`` gives it weight
    ``min(l, (R - r)*d)/l`` and, ``u = R - r`` tokens before block ``j + 1``, gives that one
    ``min(l - u*d, l')/l`` while ``u*d < l`` (nothing reaches ``j + 2``: ``l <= l' + d``).
    A head row of ``p_s`` holds ``[mass (NT*BC/R) | max (NT) | tail (NT)]`` for ``NT`` tiles:
    the mass of every block of the tile, what the tile's previous block hands on included;
    the tile's reference max; and what its last block hands to the first block of the next
    tile, which the score launch adds with that tile's max. Per head and tile that is
    ``BC/R + 2`` floats instead of ``BC`` logits."""
    NBT: tl.constexpr = BC // R
    o_g = tl.arange(0, BG)
    o_r = tl.arange(0, R)
    o_b = tl.arange(0, NBT)
    at_max, at_tail = _mass_row_sections(s_sg, NBT)
    b_p3 = tl.reshape(b_p, (BG, NBT, R))
    w_own = tl.minimum(CMP_BLOCK, (R - o_r) * CMP_STRIDE).to(tl.float32) / CMP_BLOCK
    u_next = (R - o_r) * CMP_STRIDE
    w_next = tl.where(u_next < CMP_BLOCK, tl.minimum(CMP_BLOCK - u_next, SEL_BLOCK), 0).to(tl.float32) / CMP_BLOCK
    b_own = tl.sum(b_p3 * w_own[None, None, :], 2)  # [BG, NBT]
    b_next = tl.sum(b_p3 * w_next[None, None, :], 2)  # [BG, NBT]: what block b hands to block b + 1
    b_prev = (o_b[:, None] == o_b[None, :] + 1)[None, :, :]  # [1, NBT, NBT]: b' = b - 1
    b_mass = b_own + tl.sum(tl.where(b_prev, b_next[:, None, :], 0.0), 2)
    b_tail = tl.sum(tl.where((o_b == NBT - 1)[None, :], b_next, 0.0), 1)  # [BG]
    m_g = o_g < G
    t = i0 // BC
    p_row = p_s + o_g.to(tl.int64) * s_sg  # [BG]
    tl.store(p_row[:, None] + i0 // R + o_b[None, :], b_mass, mask=m_g[:, None], eviction_policy=KEEP)
    tl.store(p_row + at_max + t, b_ref, mask=m_g, eviction_policy=KEEP)
    tl.store(p_row + at_tail + t, b_tail, mask=m_g, eviction_policy=KEEP)


@triton.jit
def _store_scores(b_s, b_m, i0, m_t, p_s, s_sg, G: tl.constexpr, BG: tl.constexpr, BC: tl.constexpr,
                  STORE_S: tl.constexpr, KEEP: tl.constexpr, R: tl.constexpr, CMP_BLOCK: tl.constexpr,
                  CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr):
    """What a compressed tile leaves for scoring (``STORE_S``): 1, its logits ``b_s [BG, BC]``
    (rows of ``p_s``, head stride ``s_sg``, tokens ``m_t``); 2, its block masses
    (:func:`_store_block_mass`) relative to the running max after the tile (``b_m`` before it)."""
    if STORE_S == 1:
        o_g = tl.arange(0, BG)
        o_t = i0 + tl.arange(0, BC)
        tl.store(p_s + o_g[:, None].to(tl.int64) * s_sg + o_t[None, :], b_s, mask=(o_g[:, None] < G) & m_t[None, :],
                 eviction_policy=KEEP)
    elif STORE_S == 2:
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_ref = tl.where(b_mn == float("-inf"), 0.0, b_mn)
        _store_block_mass(tl.exp2(b_s - b_ref[:, None]), b_ref, i0, p_s, s_sg, G, BG, BC, R, CMP_BLOCK, CMP_STRIDE,
                          SEL_BLOCK, KEEP)  # fmt: skip


@triton.jit
def _attend_range(
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
    stride ``s_sg``, L2 eviction policy ``KEEP``; :func:`_store_scores`, geometry ``R``,
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
            _store_scores(b_s, b_m, i0, m_t, p_s, s_sg, G, BG, BC, STORE_S, KEEP, R, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK)
        b_m, b_l, b_acc = _online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC)
    return b_m, b_l, b_acc


@triton.jit
def _attend_full_tiles_desc(
    b_q, d_k, d_v, i_b, i_h, lo, hi,  #
    b_m, b_l, b_acc, qk_scale, p_s, s_sg,  #
    G: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,  #
    STORE_S: tl.constexpr, PREC: tl.constexpr, KEEP: tl.constexpr,  #
    R: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,
):
    """:func:`_attend_range` over the whole tiles ``[lo, hi)`` (``hi - lo`` a multiple of
    ``BC``), keys and values read through the tensor descriptors ``d_k``/``d_v`` of a
    ``[B, T, H, D]`` cache: one bulk copy (TMA) a tile, issued stages ahead, where
    :func:`_attend_range`'s pipelined copies are per thread, with their address arithmetic
    and masks. Every tile is whole, so nothing is masked."""
    i_b, i_h = i_b.to(tl.int32), i_h.to(tl.int32)  # descriptor offsets are 32-bit
    for i0 in range(lo.to(tl.int32), hi.to(tl.int32), BC):
        o_t = i0 + tl.arange(0, BC)
        b_k = d_k.load([i_b, i0, i_h, 0]).reshape(BC, BK)
        b_v = d_v.load([i_b, i0, i_h, 0]).reshape(BC, BV)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BG, BC]
        if STORE_S != 0:
            _store_scores(b_s, b_m, i0, o_t >= 0, p_s, s_sg, G, BG, BC, STORE_S, KEEP, R, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK)
        b_m, b_l, b_acc = _online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC)
    return b_m, b_l, b_acc


@triton.jit
def _store_partial(o_part, m_part, l_part, i_r, i_h, slot, S, b_m, b_l, b_acc,  #
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
    ``SINK_STRIDE``) or, with ``MASS``, each tile's block masses (:func:`_store_block_mass`,
    same rows). With ``CMP_DESC``, ``k_cmp``/``v_cmp`` are tensor descriptors (block ``[1, BC, 1, D]``)
    and the whole tiles of a compressed split go through them; the masked last tile, if
    any, still uses plain loads (``k_cmp_ptr``/``v_cmp_ptr``). ``WIN_DESC`` does the same
    for the window. Logits and partials are stored with the L2 eviction policy ``KEEP``."""
    if PDL:
        gdc_launch_dependents()
    i_s, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    i_b, pos = _row_position(seq_lens, i_r, TQ)
    b_q = _load_group_q(q, i_r, i_h, s_qr, s_qh, G, K, BG, BK)
    b_m = tl.full([BG], float("-inf"), tl.float32)
    b_l = tl.zeros([BG], tl.float32)
    b_acc = tl.zeros([BG, BV], tl.float32)
    if i_s < S_CMP:
        # -- compressed tokens 0 .. nc-1, split evenly at run time --
        nc = _visible_cmp(pos, CMP_BLOCK, CMP_STRIDE)
        chunk = tl.cdiv(tl.cdiv(nc, S_CMP), BC) * BC
        lo = i_s * chunk
        hi = tl.minimum(lo + chunk, nc)
        p_s = logits + (i_r * (H * G) + i_h * G).to(tl.int64) * SINK_STRIDE
        STORE: tl.constexpr = 2 if MASS else 1
        if CMP_DESC:
            whole = tl.maximum(lo + (hi - lo) // BC * BC, lo)
            b_m, b_l, b_acc = _attend_full_tiles_desc(b_q, k_cmp, v_cmp, i_b, i_h, lo, whole, b_m, b_l, b_acc, qk_scale,
                                                      p_s, SINK_STRIDE, G, BG, BK, BV, BC, STORE, PREC, KEEP,
                                                      R, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK)  # fmt: skip
            lo = whole
            p_k = k_cmp_ptr + i_b * s_kcb + i_h * s_kch
            p_v = v_cmp_ptr + i_b * s_vcb + i_h * s_vch
        else:
            p_k = k_cmp + i_b * s_kcb + i_h * s_kch
            p_v = v_cmp + i_b * s_vcb + i_h * s_vch
        b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kct, s_vct, lo, hi, b_m, b_l, b_acc, qk_scale, p_s, SINK_STRIDE,
                                        G, K, V, BG, BK, BV, BC, STORE, PREC, KEEP, R, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK)  # fmt: skip
    else:
        lo, hi = _window_split(pos, i_s - S_CMP, S_WIN, WINDOW)
        if WIN_DESC:
            whole = tl.maximum(lo + (hi - lo) // BC * BC, lo)
            b_m, b_l, b_acc = _attend_full_tiles_desc(b_q, k_win, v_win, i_b, i_h, lo, whole, b_m, b_l, b_acc, qk_scale,
                                                      logits, 0, G, BG, BK, BV, BC, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
            lo = whole
            p_k = k_win_ptr + i_b * s_kwb + i_h * s_kwh
            p_v = v_win_ptr + i_b * s_vwb + i_h * s_vwh
        else:
            p_k = k_win + i_b * s_kwb + i_h * s_kwh
            p_v = v_win + i_b * s_vwb + i_h * s_vwh
        b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kwt, s_vwt, lo, hi, b_m, b_l, b_acc, qk_scale, logits, 0,
                                        G, K, V, BG, BK, BV, BC, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
    _store_partial(o_part, m_part, l_part, i_r, i_h, i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)


@triton.jit
def _pack_keys(b_sc, o_j, own, INIT: tl.constexpr, LOCAL: tl.constexpr):
    """Keys of blocks ``o_j`` with group scores ``b_sc`` (-1 past the query's own block)."""
    forced = (o_j < INIT) | (o_j > own - LOCAL)
    b_bits = tl.where(forced, INF_BITS, b_sc.to(tl.int32, bitcast=True)).to(tl.int64)
    b_key = b_bits * KEY_SHIFT + (KEY_INDEX_MAX - o_j.to(tl.int64))
    return tl.where(o_j <= own, b_key, -1)


@triton.jit
def _key_block(b_key):
    """The block of each key of :func:`_pack_keys` (its low half holds ``KEY_INDEX_MAX - block``)."""
    return (b_key & KEY_INDEX_MAX) ^ KEY_INDEX_MAX


@triton.jit
def _candidate_keys(p_cand, c0, n_cand, TJ: tl.constexpr):
    """Candidate keys ``[c0, c0 + TJ)`` and their blocks (key -1 past ``n_cand`` or in an unused slot)."""
    o_c = c0 + tl.arange(0, TJ)
    b_key = tl.load(p_cand + o_c, mask=o_c < n_cand, other=-1)
    return _key_block(b_key), b_key


@triton.jit
def _cmpx(a, b):
    """Compare-exchange: ``(larger, smaller)``."""
    return tl.maximum(a, b), tl.minimum(a, b)


@triton.jit
def _top2_merge(a1, a2, b1, b2):
    """The 2 largest of two descending pairs, descending."""
    c1, c2 = _cmpx(a1, b2)
    d1, d2 = _cmpx(a2, b1)
    e1, e2 = _cmpx(c1, d1)
    return e1, e2


@triton.jit
def _top4_merge(a1, a2, a3, a4, b1, b2, b3, b4):
    """The 4 largest of two descending quadruples, descending: the pairwise maxima of
    ``a`` and reversed ``b`` are those 4 (a bitonic sequence), sorted by two exchange stages."""
    c1, c2, c3, c4 = tl.maximum(a1, b4), tl.maximum(a2, b3), tl.maximum(a3, b2), tl.maximum(a4, b1)
    c1, c3 = _cmpx(c1, c3)
    c2, c4 = _cmpx(c2, c4)
    c1, c2 = _cmpx(c1, c2)
    c3, c4 = _cmpx(c3, c4)
    return c1, c2, c3, c4


@triton.jit
def _top8_merge(a1, a2, a3, a4, a5, a6, a7, a8, b1, b2, b3, b4, b5, b6, b7, b8):
    """The 8 largest of two descending octuples, descending (as :func:`_top4_merge`,
    three exchange stages)."""
    c1, c2, c3, c4 = tl.maximum(a1, b8), tl.maximum(a2, b7), tl.maximum(a3, b6), tl.maximum(a4, b5)
    c5, c6, c7, c8 = tl.maximum(a5, b4), tl.maximum(a6, b3), tl.maximum(a7, b2), tl.maximum(a8, b1)
    c1, c5 = _cmpx(c1, c5)
    c2, c6 = _cmpx(c2, c6)
    c3, c7 = _cmpx(c3, c7)
    c4, c8 = _cmpx(c4, c8)
    c1, c3 = _cmpx(c1, c3)
    c2, c4 = _cmpx(c2, c4)
    c5, c7 = _cmpx(c5, c7)
    c6, c8 = _cmpx(c6, c8)
    c1, c2 = _cmpx(c1, c2)
    c3, c4 = _cmpx(c3, c4)
    c5, c6 = _cmpx(c5, c6)
    c7, c8 = _cmpx(c7, c8)
    return c1, c2, c3, c4, c5, c6, c7, c8


@triton.jit
def _top_n_of_keys(b_key, N: tl.constexpr, PER_ROUND: tl.constexpr):
    """The ``N``-th largest of the distinct keys ``b_key`` (a 1-D tile in registers), by
    rounds of "largest keys below the last one". Each round can take the ``PER_ROUND`` (1,
    2, 4 or 8, dividing ``N``) largest at once in one tuple reduction: the rounds are
    serial, each a reduction across the warps, so fewer of them is shorter."""
    thr = tl.full([], INT64_MAX, tl.int64)
    # Distinct names for the rounds: the compiler types a name reassigned inside a loop as
    # loop-carried, and an int round counter cannot become an int64 tensor.
    b_none = tl.zeros_like(b_key) - 1
    if PER_ROUND == 8:
        for i_round in range(N // 8):
            b_below = tl.where(b_key < thr, b_key, -1)
            t1, t2, t3, t4, t5, t6, t7, t8 = tl.reduce(
                (b_below, b_none, b_none, b_none, b_none, b_none, b_none, b_none), 0, _top8_merge)
            thr = t8
    elif PER_ROUND == 4:
        for i_round in range(N // 4):
            b_below = tl.where(b_key < thr, b_key, -1)
            t1, t2, t3, t4 = tl.reduce((b_below, b_none, b_none, b_none), 0, _top4_merge)
            thr = t4
    elif PER_ROUND == 2:
        for i_round in range(N // 2):
            b_below = tl.where(b_key < thr, b_key, -1)
            t1, t2 = tl.reduce((b_below, b_none), 0, _top2_merge)
            thr = t2
    else:
        for i_round in range(N):
            thr = tl.max(tl.where(b_key < thr, b_key, -1), 0)
    return thr


@triton.jit
def _exchange(h, o_pos, bit: tl.constexpr, dims: tl.constexpr, up):
    """One compare-exchange stage of a bitonic network over the hypercube ``h`` (shape
    ``[2] * dims``, element positions ``o_pos``): the keys ``2**bit`` apart swap so that the
    larger one comes first where ``up`` is 0 and last where it is 1. The partner of each key
    is the key xor the pair's xor, a reduction over the pair's axis."""
    axis: tl.constexpr = dims - 1 - bit
    partner = h ^ tl.xor_sum(h, axis, keep_dims=True)
    keep_larger = ((o_pos >> bit) & 1) == up  # the first of a pair where up is 0, the second where 1
    return tl.where((h > partner) == keep_larger, h, partner)


@constexpr_function
def _log2(n: int) -> int:
    """``log2`` of a power of two, at compile time."""
    return n.bit_length() - 1


@triton.jit
def _top_of_sorted_runs(b_key, RUN: tl.constexpr):
    """The ``RUN`` largest of the keys ``b_key`` (a power of two of them), largest first, where
    consecutive runs of ``RUN`` keys (a power of two) are sorted, largest first and last in
    turn. Each level pairs the runs: the larger of the first one's ``i``-th key and the
    second one's is a bitonic run that holds the pair's largest keys, and ``log2(RUN)`` exchange
    stages sort it, again largest first and last in turn. Against ``tl.topk`` over unsorted
    keys this skips its first ``log2(RUN) * (log2(RUN) + 1) / 2`` stages over every key: at 512
    candidates and n = 16, about a third of its compare-exchanges."""
    NP_BITS: tl.constexpr = _log2(RUN)
    RUN_LEVELS: tl.constexpr = _log2(b_key.numel) - NP_BITS
    h = tl.reshape(b_key, [2] * (RUN_LEVELS + NP_BITS))
    for level in tl.static_range(RUN_LEVELS):
        # run 2i against run 2i + 1, key by key: the hypercube loses the axis of bit NP_BITS
        h = tl.max(h, axis=RUN_LEVELS - level - 1)
        o_pos = tl.reshape(tl.arange(0, 1 << (RUN_LEVELS + NP_BITS - level - 1)), [2] * (RUN_LEVELS + NP_BITS - level - 1))
        up = (o_pos >> NP_BITS) & 1
        for stage in tl.static_range(NP_BITS):
            h = _exchange(h, o_pos, NP_BITS - 1 - stage, RUN_LEVELS + NP_BITS - level - 1, up)
    return tl.reshape(h, [1 << NP_BITS])


@triton.jit
def _top_n_blocks(b_key, o_sb, p_idx, i_s, N: tl.constexpr, NP: tl.constexpr):
    """The blocks of the ``N`` largest keys of ``b_key`` (a 1-D tile in registers, -1 where
    unused; sorted runs of ``NP`` keys, :func:`_top_of_sorted_runs`) in ascending order, by one
    bitonic merge of the runs and each block's place among the ``N``. Returns this program's
    blocks ``b_j [SB]`` (ranks ``o_sb``, -1 past the last); program 0 writes the row of
    ``block_idx``, -1 in unused slots. Its compare-exchanges take each key through every stage
    at once, where the rounds of :func:`_top_n_of_keys` reduce across the warps once per round."""
    b_top = _top_of_sorted_runs(b_key, NP)
    o_n = tl.arange(0, NP)
    used = (b_top >= 0) & (o_n < N)
    b_blk = _key_block(b_top).to(tl.int32)
    # each block's place in ascending order: the used blocks below it (distinct blocks)
    b_place = tl.sum(((b_blk[None, :] < b_blk[:, None]) & used[None, :]).to(tl.int32), 1)
    b_j = tl.max(tl.where((b_place[None, :] == o_sb[:, None]) & used[None, :], b_blk[None, :], -1), 1)
    if i_s == 0:
        tl.store(p_idx + b_place, b_blk, mask=used)
        tl.store(p_idx + o_n, tl.full([NP], -1, tl.int32), mask=(o_n >= tl.sum(used.to(tl.int32), 0)) & (o_n < N))
    return b_j.to(tl.int64)


@triton.jit
def _top_n_threshold(p_cand, n_cand, own, N: tl.constexpr, TJ: tl.constexpr, ONE_TILE: tl.constexpr,
                     PER_ROUND: tl.constexpr):
    """The smallest of the ``N`` largest candidate keys (0 when all visible blocks fit).
    With ``ONE_TILE`` every key stays in registers (:func:`_top_n_of_keys`); otherwise each
    round scans the candidates ``TJ`` at a time."""
    thr = tl.full([], 0, tl.int64)
    if own + 1 > N:
        if ONE_TILE:
            o_unused, b_key = _candidate_keys(p_cand, 0, n_cand, TJ)
            thr = _top_n_of_keys(b_key, N, PER_ROUND)
        else:
            thr = tl.full([], INT64_MAX, tl.int64)
            for i_round in range(N):
                best = tl.full([], -1, tl.int64)
                for c0 in range(0, n_cand, TJ):
                    o_unused, b_key = _candidate_keys(p_cand, c0, n_cand, TJ)
                    best = tl.maximum(best, tl.max(tl.where(b_key < thr, b_key, -1), 0))
                thr = best
    return thr


@triton.jit
def _score_tile(logits, m_part, l_part, i_r, i_h, pos, j0, SINK_STRIDE, S_CMP, S,  #
                H: tl.constexpr, G: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr,
                SEL_BLOCK: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
                BG: tl.constexpr, BSC: tl.constexpr, BJ: tl.constexpr, NCOVER: tl.constexpr,
                CONTIG: tl.constexpr, R: tl.constexpr, DROP: tl.constexpr, MASS: tl.constexpr, CMP_TILE: tl.constexpr,
                FAST_LOG2: tl.constexpr):
    """Keys ``[BJ]`` of blocks ``o_j = [j0, j0 + BJ)`` (-1 past the query's own block) from
    their group scores: each head's log-sum-exp over the compressed splits turns its
    logits into probabilities, summed over the group and mapped onto selection blocks
    with the mass-conserving overlap weights (spec Eqs. 8-10). Returns ``(o_j, b_key)``.

    A block overlaps at most ``NCOVER = (l' + l) / d - 1`` compressed tokens (5 at the
    defaults), so each block reads just those: ``NCOVER`` independent loads, not a loop
    over the tile's tokens against a dense ``[tokens, blocks]`` overlap matrix (with that
    matrix the score launch took 32.5 us at batch 16, 64k on an H200; 20.3 us without).
    With ``CONTIG`` (``d`` divides ``l`` and ``l'``, ``R = l'/d`` a power of two) the
    gathered loads but ``l/d - 1`` become one contiguous load of the tile's tokens
    (10.3 against 15.1 us at batch 16, 64k, H200), read with the L2 eviction policy ``DROP``.
    With ``MASS`` the compressed pass left each tile of ``CMP_TILE`` tokens' block masses
    instead (:func:`_store_block_mass`): a block's score is then its tile's mass, and for a
    tile's first block the previous tile's tail, each scaled by its tile's max against
    the head's log-sum-exp."""
    # positions and block indices in 32 bits: in 64 the masks and keys of the [BG, BJ] tile took
    # 112 of a one-warp program's 1304 instructions (SASS for sm_90a, batch 16, 64k)
    pos = pos.to(tl.int32)
    own = pos // SEL_BLOCK
    nc = _visible_cmp(pos, CMP_BLOCK, CMP_STRIDE)
    o_g = tl.arange(0, BG)
    m_g = o_g < G
    i_rq = (i_r * (H * G) + i_h * G + o_g).to(tl.int64)  # [BG]
    # -- log2-sum-exp of each head over all compressed splits --
    o_sp = tl.arange(0, BSC)
    m_gs = m_g[:, None] & (o_sp[None, :] < S_CMP)
    b_ms = tl.load(m_part + i_rq[:, None] * S + o_sp[None, :], mask=m_gs, other=float("-inf"))  # [BG, BSC]
    b_ls = tl.load(l_part + i_rq[:, None] * S + o_sp[None, :], mask=m_gs, other=0.0)
    b_mx = tl.max(b_ms, 1)
    b_mx = tl.where(b_mx == float("-inf"), 0.0, b_mx)
    b_sum = tl.sum(b_ls * tl.exp2(b_ms - b_mx[:, None]), 1)
    b_sum = tl.where(b_sum > 0, b_sum, 1.0)  # [BG]
    if FAST_LOG2:
        # the special-function unit's log2 (lg2.approx, relative error 2**-22) where Triton's
        # log2 is a ten-term polynomial: 104 of a one-warp program's 1216 instructions at
        # batch 16, 64k; the interpreter cannot run it
        b_lse = b_mx + libdevice.fast_log2f(b_sum)
    else:
        b_lse = b_mx + tl.log2(b_sum)
    # -- each block gathers the NCOVER compressed tokens that can overlap it: the
    # first is the one whose [i*d, i*d + l) ends just past the block's start --
    o_j = j0 + tl.arange(0, BJ)
    j_lo = o_j * SEL_BLOCK
    b_score = tl.zeros([BJ], tl.float32)
    if MASS:
        # block j's tokens lie in compressed tile j // NBT; a tile exists where its first
        # token is visible
        NBT: tl.constexpr = CMP_TILE // R
        at_max, at_tail = _mass_row_sections(SINK_STRIDE, NBT)
        p_row = logits + i_rq[:, None] * SINK_STRIDE  # [BG, 1]
        t_j = o_j // NBT
        m_own = m_g[:, None] & ((t_j * CMP_TILE < nc) & (o_j <= own))[None, :]
        b_ref = tl.load(p_row + at_max + t_j[None, :], mask=m_own, other=float("-inf"))
        b_mass = tl.load(p_row + o_j[None, :], mask=m_own, other=0.0, eviction_policy=DROP)
        b_score = tl.sum(tl.exp2(b_ref - b_lse[:, None]) * b_mass, 0)
        first = (o_j % NBT == 0) & (o_j > 0) & (t_j * CMP_TILE <= nc) & (o_j <= own)
        m_tail = m_g[:, None] & first[None, :]
        b_ref = tl.load(p_row + at_max + t_j[None, :] - 1, mask=m_tail, other=float("-inf"))
        b_tail = tl.load(p_row + at_tail + t_j[None, :] - 1, mask=m_tail, other=0.0)
        b_score += tl.sum(tl.exp2(b_ref - b_lse[:, None]) * b_tail, 0)
    elif CONTIG:
        # Block j starts at token j*R (R = l'/d): its tokens j*R + r (r < R) are the
        # tile's one contiguous range [j0*R, (j0 + BJ)*R), read once and folded [BJ, R]
        # with weights min(l, (R - r)*d)/l; the C - 1 tokens j*R - u before it (C = l/d)
        # reach into the block by min(l - u*d, l') and are gathered, one load each.
        o_c = j0 * R + tl.arange(0, BJ * R)
        m_c = (o_c < nc) & (o_c // R <= own)
        b_s = tl.load(logits + i_rq[:, None] * SINK_STRIDE + o_c[None, :], mask=m_g[:, None] & m_c[None, :], other=float("-inf"),
                      eviction_policy=DROP)  # fmt: skip
        b_pc = tl.sum(tl.exp2(b_s - b_lse[:, None]), 0)  # [BJ*R] group probability (Eq. 10)
        o_r = tl.arange(0, R)
        b_wr = tl.minimum(CMP_BLOCK, (R - o_r) * CMP_STRIDE).to(tl.float32) / CMP_BLOCK  # [R]
        b_score = tl.sum(tl.reshape(b_pc, (BJ, R)) * b_wr[None, :], 1)
        for u in tl.static_range(1, CMP_BLOCK // CMP_STRIDE):
            o_i = o_j * R - u
            m_i = (o_i >= 0) & (o_i < nc) & (o_j <= own)
            b_s = tl.load(logits + i_rq[:, None] * SINK_STRIDE + o_i[None, :], mask=m_g[:, None] & m_i[None, :], other=float("-inf"))
            b_pg = tl.sum(tl.exp2(b_s - b_lse[:, None]), 0)
            b_w = tl.minimum(tl.full([], CMP_BLOCK - u * CMP_STRIDE, tl.int32), SEL_BLOCK).to(tl.float32)
            b_score += tl.where(m_i, b_pg * (b_w / CMP_BLOCK), 0.0)
    else:
        i_first = tl.maximum(j_lo - CMP_BLOCK + CMP_STRIDE, 0) // CMP_STRIDE  # [BJ]
        for u in tl.static_range(NCOVER):
            o_i = i_first + u
            c_lo = o_i * CMP_STRIDE
            # overlap of [i*d, i*d + l) with [j*l', (j+1)*l'), divided by l (Eq. 9)
            b_w = tl.minimum(c_lo + CMP_BLOCK, j_lo + SEL_BLOCK) - tl.maximum(c_lo, j_lo)
            m_i = (o_i < nc) & (b_w > 0) & (o_j <= own)
            b_s = tl.load(logits + i_rq[:, None] * SINK_STRIDE + o_i[None, :], mask=m_g[:, None] & m_i[None, :], other=float("-inf"))
            b_pg = tl.sum(tl.exp2(b_s - b_lse[:, None]), 0)  # [BJ] group probability (Eq. 10)
            b_score += tl.where(m_i, b_pg * (b_w.to(tl.float32) / CMP_BLOCK), 0.0)
    return o_j, _pack_keys(b_score, o_j, own, INIT, LOCAL)


@triton.jit
def decode_score_kernel(
    seq_lens, logits, m_part, l_part, cand,  #
    SINK_STRIDE, NCAND, S_CMP, S,  #
    TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr,  #
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
    BG: tl.constexpr, BSC: tl.constexpr, BJ: tl.constexpr, NCOVER: tl.constexpr, PDL: tl.constexpr,
    CONTIG: tl.constexpr, R: tl.constexpr, DROP: tl.constexpr, MASS: tl.constexpr, CMP_TILE: tl.constexpr,
    SORTED: tl.constexpr, FAST_LOG2: tl.constexpr,
):
    """Keys of blocks ``[j0, j0 + BJ)`` (:func:`_score_tile`), kept in registers: the
    program writes only its tile's ``N`` best keys (the candidates) into the tile's ``NP``
    slots, padded with -1. The global top-n lies among the candidates of all tiles. Tile-major
    slots in ascending block order keep a row's candidates in ascending block order (what
    the rounds of the selection programs take); with ``SORTED`` each tile's slots hold its
    keys sorted, largest first in even tiles and last in odd ones (what one bitonic merge of
    runs takes, :func:`_top_of_sorted_runs`)."""
    if PDL:
        gdc_launch_dependents()
    i_j, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    _, pos = _row_position(seq_lens, i_r, TQ)
    j0 = i_j * BJ
    if PDL:
        gdc_wait()
    if j0 <= pos // SEL_BLOCK:
        o_j, b_key = _score_tile(logits, m_part, l_part, i_r, i_h, pos, j0, SINK_STRIDE, S_CMP, S,
                                 H, G, CMP_BLOCK, CMP_STRIDE, SEL_BLOCK, INIT, LOCAL, BG, BSC, BJ, NCOVER, CONTIG, R, DROP,
                                 MASS, CMP_TILE, FAST_LOG2)  # fmt: skip
        # -- this tile's candidates: keys with fewer than N larger keys in the tile --
        b_rank = tl.sum((b_key[None, :] > b_key[:, None]).to(tl.int32), 1)  # [BJ]
        b_cand = (b_rank < N) & (b_key >= 0)
        n_found = tl.sum(b_cand.to(tl.int32), 0)
        o_n = tl.arange(0, NP)
        p_c = cand + i_rh.to(tl.int64) * NCAND + i_j * NP
        if SORTED:
            # the candidates are the keys ranked 0 .. n_found - 1: a sorted run for
            # _top_of_sorted_runs, descending in even tiles and ascending in odd ones
            up = i_j % 2
            tl.store(p_c + tl.where(up == 1, NP - 1 - b_rank, b_rank), b_key, mask=b_cand)
            pad = tl.where(up == 1, o_n < NP - n_found, o_n >= n_found)
        else:
            tl.store(p_c + tl.cumsum(b_cand.to(tl.int32), 0) - 1, b_key, mask=b_cand)
            pad = o_n >= n_found
        tl.store(p_c + o_n, tl.full([NP], -1, tl.int64), mask=pad)


@triton.jit
def _attend_blocks_desc(b_q, d_k, d_v, i_b, i_h, pos, b_j, b_m, b_l, b_acc, qk_scale,  #
                        SEL_BLOCK: tl.constexpr, SB: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        PREC: tl.constexpr):
    """Online softmax over the selected blocks ``b_j [SB]`` (-1: unused slot), each one bulk
    copy of ``SEL_BLOCK`` tokens through the descriptors ``d_k``/``d_v``; needs ``pos + 1 >=
    SEL_BLOCK``. A block that reaches past ``pos`` (the query's own) is read from
    ``pos + 1 - SEL_BLOCK`` on instead, so that no token past the length is read (a cache
    may hold anything there, NaN included, and 0 * NaN would reach the output); the tokens
    before the block are masked, as is every token of an unused slot (a fully masked tile
    leaves the state as it was)."""
    i_b, i_h, last = i_b.to(tl.int32), i_h.to(tl.int32), pos.to(tl.int32) + 1  # descriptor offsets are 32-bit
    o_sb = tl.arange(0, SB)
    for r in range(SB):
        j = tl.sum(tl.where(o_sb == r, b_j, 0), 0).to(tl.int32)
        lo = tl.maximum(j, 0) * SEL_BLOCK
        hi = tl.where(j >= 0, tl.minimum(lo + SEL_BLOCK, last), lo)
        i0 = tl.minimum(lo, last - SEL_BLOCK)
        b_k = d_k.load([i_b, i0, i_h, 0]).reshape(SEL_BLOCK, BK)
        b_v = d_v.load([i_b, i0, i_h, 0]).reshape(SEL_BLOCK, BV)
        o_t = i0 + tl.arange(0, SEL_BLOCK)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BG, SEL_BLOCK]
        b_s = tl.where(((o_t >= lo) & (o_t < hi))[None, :], b_s, float("-inf"))
        b_m, b_l, b_acc = _online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC)
    return b_m, b_l, b_acc


@triton.jit
def decode_selected_fwd_kernel(
    q, k, v, seq_lens, cand, block_idx, k_win, v_win,  #
    o_part, m_part, l_part,  #
    s_qr, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,  #
    s_kwb, s_kwt, s_kwh, s_vwb, s_vwt, s_vwh,  #
    qk_scale, NCAND, SLOT0, S, S_SLC, S_WIN, WIN_SLOT0,  #
    TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    SEL_BLOCK: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, SB: tl.constexpr, BJ: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,  #
    TJ: tl.constexpr, ONE_TILE: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
    PER_ROUND: tl.constexpr, SEL_DESC: tl.constexpr, SMALL_TILE: tl.constexpr, d_k, d_v,
    WIN: tl.constexpr, WINDOW: tl.constexpr, WIN_TILE: tl.constexpr,
    KEEP: tl.constexpr, RANKED: tl.constexpr, BITONIC: tl.constexpr,
):
    """With ``SEL_DESC``, ``d_k``/``d_v`` are tensor descriptors of the cache (block
    ``[1, SEL_BLOCK, 1, D]``) and, once the sequence holds a whole block, every selected
    block is one bulk copy in a loop the compiler pipelines (:func:`_attend_blocks_desc`).

    With ``WIN``, programs ``S_SLC .. S_SLC + S_WIN - 1`` of a row-group are the window's
    splits instead (slots from ``WIN_SLOT0``): they need nothing from the launches before,
    so they do not wait for them, and their reads overlap the selection programs' top-n."""
    if PDL:
        gdc_launch_dependents()
    i_s, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    i_b, pos = _row_position(seq_lens, i_r, TQ)
    b_q = _load_group_q(q, i_r, i_h, s_qr, s_qh, G, K, BG, BK)
    # a window split only where WIN; without it the window path is not compiled at all
    is_window = i_s >= S_SLC if WIN else False
    if is_window:
        lo, hi = _window_split(pos, i_s - S_SLC, S_WIN, WINDOW)
        b_m = tl.full([BG], float("-inf"), tl.float32)
        b_l = tl.zeros([BG], tl.float32)
        b_acc = tl.zeros([BG, BV], tl.float32)
        p_k = k_win + i_b * s_kwb + i_h * s_kwh
        p_v = v_win + i_b * s_vwb + i_h * s_vwh
        b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kwt, s_vwt, lo, hi, b_m, b_l, b_acc, qk_scale, o_part, 0,
                                        G, K, V, BG, BK, BV, WIN_TILE, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
        _store_partial(o_part, m_part, l_part, i_r, i_h, WIN_SLOT0 + i_s - S_SLC, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)
    else:
        _selected_program(q, k, v, cand, block_idx, o_part, m_part, l_part, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                          qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q,
                          H, G, K, V, SEL_BLOCK, N, NP, SB, BJ, BG, BK, BV, BC, TJ, ONE_TILE, PREC, PDL,
                          PER_ROUND, SEL_DESC, SMALL_TILE, d_k, d_v, KEEP, RANKED, BITONIC)  # fmt: skip


@triton.jit
def _take_ranks(o_j, b_key, thr, count, o_sb, b_j, p_idx, i_s):
    """One tile of keys in ascending block order: the blocks it selects (keys ``>= thr``)
    take the next ranks after ``count``; the program's blocks ``b_j [SB]`` (ranks ``o_sb``)
    are filled in and program 0 writes the tile's blocks to ``block_idx``. Returns
    ``(b_j, count)``."""
    b_sel = (b_key >= thr) & (b_key >= 0)
    b_rank = tl.cumsum(b_sel.to(tl.int32), 0) + count  # 1-based among the selected
    b_hit = b_sel[None, :] & (b_rank[None, :] == o_sb[:, None] + 1)  # [SB, tile]
    b_j = tl.maximum(b_j, tl.max(tl.where(b_hit, o_j[None, :], -1), 1))
    if i_s == 0:
        tl.store(p_idx + b_rank - 1, o_j.to(tl.int32), mask=b_sel)
    return b_j, count + tl.sum(b_sel.to(tl.int32), 0)


@triton.jit
def _selected_program(
    q, k, v, cand, block_idx, o_part, m_part, l_part, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,  #
    qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q,  #
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    SEL_BLOCK: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, SB: tl.constexpr, BJ: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,  #
    TJ: tl.constexpr, ONE_TILE: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
    PER_ROUND: tl.constexpr, SEL_DESC: tl.constexpr, SMALL_TILE: tl.constexpr, d_k, d_v, KEEP: tl.constexpr,
    RANKED: tl.constexpr, BITONIC: tl.constexpr,
):
    """One selection program: waits for the scores, finds the top-n, attends over its
    share ``[i_s * SB, (i_s + 1) * SB)`` of the selected blocks and writes its partial.
    With ``RANKED`` (one score tile holds all of a row's blocks) the candidates already are
    the top-n, and the rounds are skipped."""
    own = pos // SEL_BLOCK
    if PDL:
        gdc_wait()
    # -- ranks of the selected blocks in ascending order; this program takes ranks i_s*SB .. --
    o_sb = i_s * SB + tl.arange(0, SB)
    p_idx = block_idx + i_rh.to(tl.int64) * N
    # -- top-n among the candidates of the score tiles that hold visible blocks --
    p_cand = cand + i_rh.to(tl.int64) * NCAND
    n_cand = (own // BJ + 1) * NP
    if BITONIC:
        o_unused, b_key = _candidate_keys(p_cand, 0, n_cand, TJ)
        b_j = _top_n_blocks(b_key, o_sb, p_idx, i_s, N, NP)
    else:
        b_j = tl.full([SB], -1, tl.int64)
        count = tl.full([], 0, tl.int32)
        if RANKED:
            thr = tl.full([], 0, tl.int64)  # every candidate: the tile's rank kept exactly the top-n
        else:
            thr = _top_n_threshold(p_cand, n_cand, own, N, TJ, ONE_TILE, PER_ROUND)
        for c0 in range(0, n_cand, TJ):
            o_j, b_key = _candidate_keys(p_cand, c0, n_cand, TJ)
            b_j, count = _take_ranks(o_j, b_key, thr, count, o_sb, b_j, p_idx, i_s)
        o_n = tl.arange(0, NP)
        if i_s == 0:
            tl.store(p_idx + o_n, tl.full([NP], -1, tl.int32), mask=(o_n >= count) & (o_n < N))
    # -- attention over this program's blocks, positions <= pos --
    b_m = tl.full([BG], float("-inf"), tl.float32)
    b_l = tl.zeros([BG], tl.float32)
    b_acc = tl.zeros([BG, BV], tl.float32)
    if SEL_DESC:
        if pos + 1 >= SEL_BLOCK:
            b_m, b_l, b_acc = _attend_blocks_desc(b_q, d_k, d_v, i_b, i_h, pos, b_j, b_m, b_l, b_acc, qk_scale,
                                                  SEL_BLOCK, SB, BK, BV, PREC)  # fmt: skip
        else:
            # Only block 0 is visible, and only part of it; it is this program's first slot
            # or none. Small masked tiles: the register budget of the kernel is that of its
            # largest path, and whole-block tiles here would spill (255 registers by ptxas
            # for sm_90a, against 108 without this path).
            p_k = k + i_b * s_kb + i_h * s_kh
            p_v = v + i_b * s_vb + i_h * s_vh
            j = tl.sum(tl.where(tl.arange(0, SB) == 0, b_j, 0), 0)
            hi = tl.where(j == 0, pos + 1, 0)
            b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kt, s_vt, 0, hi, b_m, b_l, b_acc, qk_scale, o_part, 0,
                                            G, K, V, BG, BK, BV, SMALL_TILE, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
    else:
        p_k = k + i_b * s_kb + i_h * s_kh
        p_v = v + i_b * s_vb + i_h * s_vh
        for r in tl.static_range(SB):
            j = tl.sum(tl.where(tl.arange(0, SB) == r, b_j, 0), 0)
            lo = tl.maximum(j, 0) * SEL_BLOCK
            hi = tl.where(j >= 0, tl.minimum(lo + SEL_BLOCK, pos + 1), lo)
            b_m, b_l, b_acc = _attend_range(b_q, p_k, p_v, s_kt, s_vt, lo, hi, b_m, b_l, b_acc, qk_scale, o_part, 0,
                                            G, K, V, BG, BK, BV, BC, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
    _store_partial(o_part, m_part, l_part, i_r, i_h, SLOT0 + i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)


@triton.jit
def _branch_norm(b_m, m_c):
    """Max ``[HB]`` (0 when empty) of the slots ``m_c`` of one branch, log2 units."""
    b_mx = tl.max(tl.where(m_c, b_m, float("-inf")), 1)
    return tl.where(b_mx == float("-inf"), 0.0, b_mx)


@triton.jit
def _branch_scale(b_m, b_l, m_c, b_mx, b_g):
    """``gate / sum`` ``[HB]`` of one branch: a branch with nothing visible (no compressed
    token yet) has sum 0 and contributes 0."""
    b_sum = tl.sum(tl.where(m_c, tl.exp2(b_m - b_mx[:, None]) * b_l, 0.0), 1)
    return tl.where(b_sum > 0, b_g / tl.where(b_sum > 0, b_sum, 1.0), 0.0)


@triton.jit
def _load_acc_chunk(o_part, m_part, o_h, s0, S, V: tl.constexpr, BSX: tl.constexpr, BV: tl.constexpr, DROP: tl.constexpr):
    """Slots ``[s0, s0 + BSX)`` of heads ``o_h``: max ``[HB, BSX]`` and acc ``[HB, BSX, BV]``."""
    o_x = s0 + tl.arange(0, BSX)
    o_v = tl.arange(0, BV)
    m_x = o_x < S
    p_x = o_h[:, None] * S + o_x[None, :]  # [HB, BSX]
    b_mx = tl.load(m_part + p_x, mask=m_x[None, :], other=float("-inf"), eviction_policy=DROP)
    b_acc = tl.load(o_part + p_x[:, :, None] * V + o_v[None, None, :], mask=m_x[None, :, None] & (o_v[None, None, :] < V), other=0.0,
                    eviction_policy=DROP)  # fmt: skip
    return b_mx, b_acc


@triton.jit
def _gated_chunk(b_mx, b_acc, s0, S, S_CMP, S_WIN, b_ref_cmp, b_ref_win, b_ref_slc, b_sc_cmp, b_sc_win, b_sc_slc, BSX: tl.constexpr):
    """``sum_s gate * exp2(m_s - ref) / sum * acc_s`` over one chunk of slots ``[HB, BV]``,
    each slot scaled by its branch's reference max and ``gate / sum``."""
    o_x = s0 + tl.arange(0, BSX)
    is_cmp = (o_x < S_CMP)[None, :]
    is_win = ((o_x >= S_CMP) & (o_x < S_CMP + S_WIN))[None, :]
    b_ref = tl.where(is_cmp, b_ref_cmp[:, None], tl.where(is_win, b_ref_win[:, None], b_ref_slc[:, None]))
    b_scale = tl.where(is_cmp, b_sc_cmp[:, None], tl.where(is_win, b_sc_win[:, None], b_sc_slc[:, None]))
    b_coef = tl.where((o_x < S)[None, :], tl.exp2(b_mx - b_ref) * b_scale, 0.0)  # [HB, BSX]
    return tl.sum(b_coef[:, :, None] * b_acc, 1)


@triton.jit
def _projected_gate(x_row, w, b, w_rows, HIDDEN, HB: tl.constexpr, BKG: tl.constexpr, HAS_BIAS: tl.constexpr):
    """``sigmoid(x_row . w[w_rows] + b[w_rows])`` ``[HB]`` in float32: the logits rounded to the
    inputs' dtype as ``nn.Linear`` returns them, the sigmoid in float32 rounded again, as
    ``torch.sigmoid`` does on 16-bit tensors (see :mod:`nsa.ops.gates.projection`)."""
    acc = tl.zeros([HB], dtype=tl.float32)
    for k0 in range(0, HIDDEN, BKG):
        o_k = k0 + tl.arange(0, BKG)
        m_k = o_k < HIDDEN
        b_x = tl.load(x_row + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_w = tl.load(w + w_rows[:, None] * HIDDEN + o_k[None, :], mask=m_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(b_w * b_x[None, :], 1)
    dtype = x_row.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b + w_rows).to(tl.float32)
    return tl.sigmoid(acc.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit
def decode_combine_kernel(
    o_part, m_part, l_part, gates, o, gate_w, gate_b,  #
    S_CMP, S_WIN, S, HQ, HIDDEN, stride_gx,  #
    V: tl.constexpr, HB: tl.constexpr, BS: tl.constexpr, BSX: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr,
    DROP: tl.constexpr, GATE_PROJ: tl.constexpr, BKG: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Heads ``[i*HB, (i+1)*HB)`` of the flattened ``rows * HQ``: merge each branch's
    splits and apply the gates. ``gates [rows*HQ, 3]``, ``o [rows*HQ, V]``; with
    ``GATE_PROJ``, ``gates`` is the hidden state ``x`` (rows ``stride_gx`` apart, ``HIDDEN``
    wide) and each gate ``sigmoid(x . gate_w[3 * head + branch] + gate_b[...])``, computed
    before the wait for the launch before (nothing of it comes from there).

    Slots: compressed ``[0, S_CMP)``, window ``[S_CMP, S_CMP + S_WIN)``, selected after;
    gates (cmp, slc, win). The ``(max, sum)`` of every slot fit in registers at once;
    the ``acc`` rows are read ``BSX`` slots at a time, so the tile stays small at any
    split count. The first chunk is loaded with the ``(max, sum)``, not after them:
    usually it is the only one, and the kernel then waits on memory once. Partials are
    read with the L2 eviction policy ``DROP``: nothing reads them again."""
    o_h = tl.program_id(0).to(tl.int64) * HB + tl.arange(0, HB)
    o_v = tl.arange(0, BV)
    if GATE_PROJ:  # a program's heads share a row: HB divides HQ
        x_row = gates + (tl.program_id(0).to(tl.int64) * HB // HQ) * stride_gx
        w_rows = (o_h % HQ) * 3
        b_g_cmp = _projected_gate(x_row, gate_w, gate_b, w_rows, HIDDEN, HB, BKG, HAS_BIAS)
        b_g_slc = _projected_gate(x_row, gate_w, gate_b, w_rows + 1, HIDDEN, HB, BKG, HAS_BIAS)
        b_g_win = _projected_gate(x_row, gate_w, gate_b, w_rows + 2, HIDDEN, HB, BKG, HAS_BIAS)
    else:
        b_g_cmp = tl.load(gates + o_h * 3).to(tl.float32)
        b_g_slc = tl.load(gates + o_h * 3 + 1).to(tl.float32)
        b_g_win = tl.load(gates + o_h * 3 + 2).to(tl.float32)
    if PDL:
        gdc_wait()
    o_s = tl.arange(0, BS)
    m_s = o_s < S
    b_m = tl.load(m_part + o_h[:, None] * S + o_s[None, :], mask=m_s[None, :], other=float("-inf"), eviction_policy=DROP)  # [HB, BS]
    b_l = tl.load(l_part + o_h[:, None] * S + o_s[None, :], mask=m_s[None, :], other=0.0, eviction_policy=DROP)
    b_mx0, b_acc0 = _load_acc_chunk(o_part, m_part, o_h, 0, S, V, BSX, BV, DROP)
    m_cmp = (o_s < S_CMP)[None, :]
    m_win = ((o_s >= S_CMP) & (o_s < S_CMP + S_WIN))[None, :]
    m_slc = ((o_s >= S_CMP + S_WIN) & m_s)[None, :]
    b_ref_cmp, b_ref_win, b_ref_slc = _branch_norm(b_m, m_cmp), _branch_norm(b_m, m_win), _branch_norm(b_m, m_slc)
    b_sc_cmp = _branch_scale(b_m, b_l, m_cmp, b_ref_cmp, b_g_cmp)
    b_sc_win = _branch_scale(b_m, b_l, m_win, b_ref_win, b_g_win)
    b_sc_slc = _branch_scale(b_m, b_l, m_slc, b_ref_slc, b_g_slc)
    b_o = _gated_chunk(b_mx0, b_acc0, 0, S, S_CMP, S_WIN, b_ref_cmp, b_ref_win, b_ref_slc,
                       b_sc_cmp, b_sc_win, b_sc_slc, BSX)  # fmt: skip
    for s0 in range(BSX, S, BSX):
        b_mx, b_acc = _load_acc_chunk(o_part, m_part, o_h, s0, S, V, BSX, BV, DROP)
        b_o += _gated_chunk(b_mx, b_acc, s0, S, S_CMP, S_WIN, b_ref_cmp, b_ref_win, b_ref_slc,
                            b_sc_cmp, b_sc_win, b_sc_slc, BSX)  # fmt: skip
    tl.store(o + o_h[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=o_v[None, :] < V)


# Once the batch fills the GPU the compressed launch is one wave: (programs per SM, pipeline
# stages of each), the deeper first wherever its wave holds a split of every row-group. Shared
# memory and registers bound the programs per SM: 3 in 3 stages (a quarter of the registers
# left for the programs that programmatic dependent launch starts early), or 4 in 2.
FILL_CMP_WAVES = ((3, 3), (4, 2))


def fill_cmp_wave(rows_groups: int, device: torch.device) -> Tuple[int, int]:
    """``(programs per SM, pipeline stages)`` of the compressed launch once the batch fills the
    GPU: 3 programs in 3 stages while one wave of them holds a split of every (row, KV group),
    else 4 in 2 stages (whose wave is a third larger). On an H200, PDL on, us (session 42;
    ``docs/perf/decode.md``): batch 32, (3, 2, 8) in 3 stages against (4, 2, 8) in 2, 56.7-56.9
    against 60.5-60.6 at 8k to 131.2-131.5 against 137.4-138.6 at 64k; batch 64, (1, 2, 8) against
    (2, 2, 8), 96.0 against 98.5-99.0 at 8k to 248.1-248.2 against 252.5-253.6 at 64k; batch 16,
    (6, 2, 8) against (8, 2, 8), 79.9-80.1 against 81.1-81.3 at 64k, 61.2-61.4 against 61.0-61.1
    at 32k, but 48.5-48.6 against 46.6-46.7 at 16k and 41.1-41.2 against 40.0-40.1 at 8k. Two waves
    lose far more: (2, 2, 8) in 3 stages at batch 64, 287.2-287.5 us at 64k."""
    sms = _sm_count(device)
    return next(((per_sm, stages) for per_sm, stages in FILL_CMP_WAVES if rows_groups <= per_sm * sms),
                FILL_CMP_WAVES[-1])


# Once the batch fills the GPU the selected launch holds at most this many programs an SM: each
# bf16 program of head dim 128 takes 70 KiB of shared memory (3 pipeline stages of a block).
FILL_SELECTED_PROGRAMS_PER_SM = 3


def fill_selected_split(rows_groups: int, config: NSAConfig, device: torch.device) -> Tuple[int, int]:
    """``(window splits, selected blocks per program)`` once the batch fills the GPU, by the waves
    of the selected launch (``FILL_SELECTED_PROGRAMS_PER_SM`` programs an SM, the window's splits
    among them): 4 blocks a program where that launch stays one wave, else 8; and one window split
    instead of 256-token ones where that saves the launch a wave. On 132 SMs (paper defaults,
    H = 4): (2, 4) at batch 16, (1, 8) at 32 and 64. On an H200, PDL on, us, twice each (session
    42, ``docs/perf/decode.md``): batch 16, (6, 2, 4) against (6, 2, 8), 39.3-39.6 against
    41.0-41.7 at 8k and 79.0-79.7 against 80.4-80.9 at 64k (8 blocks and one window split, 39.9-40.3
    and 80.3-81.2; (6, 1, 4), 39.6 and 80.6-80.7); batch 32, (3, 1, 8) against (3, 2, 8),
    56.8-57.1 against 56.5-56.9 at 8k and 129.7-130.0 against 131.5-132.2 at 64k ((3, 2, 4), a
    second wave, 61.9-62.0 and 134.6-134.9); batch 64, (1, 1, 8) against (1, 2, 8), 91.0 against
    95.2 at 8k and 244.0-244.3 against 246.8-247.1 at 64k."""
    slots = FILL_SELECTED_PROGRAMS_PER_SM * _sm_count(device)
    win = max(1, cdiv(config.window, 256))

    def waves(blocks: int, window_splits: int) -> int:
        return cdiv(rows_groups * (cdiv(config.sel_count, blocks) + window_splits), slots)

    blocks = 4 if waves(4, win) == 1 else 8
    return (1 if waves(blocks, 1) < waves(blocks, win) else win), blocks


def default_splits(rows_groups: int, nc_cap: int, config: NSAConfig, device: torch.device) -> Tuple[int, int, int]:
    """``(compressed splits, window splits, selected blocks per program)``.

    The compressed branch is the bulk of the bytes: split it into about four programs
    per SM whatever the batch, in splits of at least ~256 tokens (at batch 1, 64k, 16
    splits of 256 measured 3 us faster than 32 of 128: fewer partials to merge), but
    into 8 splits wherever that count allows, however short: at batch 1, 8k, 8 splits
    of 64 tokens measured 20.1 us against 22.1 for 2 of 256 (a few serial tiles each
    instead of 4 programs per group in all; H200). The window takes ~128-token splits
    and each selected program one block.

    Once the batch alone fills the GPU, the window runs in the selected launch
    (``window_in_selected``) and the compressed launch is one wave: as many splits as
    :func:`fill_cmp_wave`'s programs per SM allow (3 in 3 pipeline stages, or 4 in 2), with
    window splits and selected blocks a program from :func:`fill_selected_split`. On 132 SMs at
    64k that is (6, 2, 4) at batch 16, (3, 1, 8) at 32 and (1, 1, 8) at 64. Before session 42 it
    was 4 programs in 2 stages, 256-token window splits and 8 blocks a program at every such
    batch: at batch 16, 64k on an H100, (8, 2, 8) took 106.0-106.4 us against 107.3-107.6 for
    (6, 2, 8) in 3 stages (PDL off at the time); that one took 106.6-107.2 us against
    113.8-114.5 for the earlier (9, 4, 4) with the window in the compressed launch; 7
    compressed splits of 3 stages (two waves) took 119.9 us, and (6, 4, 4), (6, 4, 8), (6, 1,
    8), (6, 2, 16) 108.7-112.1."""
    sms = _sm_count(device)
    if _batch_fills_gpu(rows_groups, config, device):
        per_sm, _ = fill_cmp_wave(rows_groups, device)
        return (max(1, per_sm * sms // rows_groups),) + fill_selected_split(rows_groups, config, device)
    s_cmp = max(1, min(cdiv(4 * sms, rows_groups), max(cdiv(nc_cap, 256), 8)))
    return s_cmp, max(1, cdiv(config.window, 128)), 1


def default_score_warps(programs: int, device: torch.device) -> int:
    """Warps of a score program: 4, or 1 once the score launch has more than four programs
    per SM. Past that point its 4-warp programs (56 registers) no longer fit in one wave, and
    each program's cross-warp reductions (the group sum, the rank in its tile) wait at
    barriers; one warp needs none. Batch 16 on an H200 (132 SMs), graph replay: 64k (2048
    programs) 83.9-84.1 against 86.5-86.9 us (the score kernel 8.2 against 11.2 us), 32k
    (1024) 61.3-61.4 against 62.3-62.5; 16k (512) equal; 8k (256) 43.4 against 42.7, and at
    batch 1 (128 programs at 64k) 26.6 against 23.5. On an H100 at batch 16: 64k 98.5-98.6
    against 101.1-101.9, 32k 71.5-71.8 against 72.5-72.6, 8k equal."""
    return 1 if programs > 4 * _sm_count(device) else 4


def _sm_count(device: torch.device) -> int:
    """SMs the launch heuristics plan for; the interpreter counts as two."""
    return sm_count(device, interpreter=2)


def _batch_fills_gpu(rows_groups: int, config: NSAConfig, device: torch.device) -> bool:
    """Whether one selected block per (row, group) program is more than four programs per
    SM: the batch alone then keeps the GPU busy, and the launch choices switch from hiding
    latency to moving bytes (batch 16 at the defaults is past it, batch 1 is not)."""
    return rows_groups * config.sel_count > 4 * _sm_count(device)


def decode_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: Union[torch.Tensor, GateProjection],
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
    num_warps: int = 4,
    cmp_warps: Optional[int] = None,
    combine_chunk: int = 64,
    score_blocks: Optional[int] = None,
    pdl: Optional[Union[bool, Tuple[bool, bool, bool]]] = None,
    score_contig: bool = True,
    cmp_desc: Optional[bool] = None,
    win_desc: bool = False,
    cmp_tile: Optional[int] = None,
    cmp_stages: Optional[int] = None,
    sel_desc: Optional[bool] = None,
    topn_per_round: Optional[int] = None,
    combine_heads: Optional[int] = None,
    window_in_selected: Optional[bool] = None,
    win_tile: Optional[int] = None,
    l2_hints: Optional[bool] = None,
    score_mass: Optional[bool] = None,
    score_warps: Optional[int] = None,
    topn_bitonic: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Launch the four decode kernels; returns ``(o, block_idx)``.

    Overrides of the automatic choices (for tests and tuning): ``splits = (compressed,
    window, selected blocks per program)``, ``block_tile`` (candidates scanned at once by
    top-n), ``token_tile`` (tokens per attention tile), ``num_warps`` of the attention
    kernels (``cmp_warps`` of the compressed/window one alone), ``combine_chunk`` (splits
    the combine reads at once), ``score_blocks`` (selection blocks per scoring program:
    32, which measured 2 us faster than 64 at batch 1, 64k, but 64 for a batch-1 cache of at
    most 128 blocks), ``pdl`` (programmatic dependent
    launch: for the score, selected and combine launches alike, or a tuple of three flags, one
    each, which launches start early; every kernel still waits where it reads the launch
    before, which costs nothing in a launch that starts in stream order; at batch 1 all three
    early measured fastest on an H100, 23.6 us at 64k against 24.5-28.1 for the seven others),
    ``score_contig`` (scoring reads each tile's tokens as one contiguous range
    where the geometry allows), ``cmp_desc`` (compressed keys/values through tensor
    descriptors; ``win_desc`` the window's), ``cmp_tile``/``cmp_stages`` (token tile, at
    least 16 on a GPU, and pipeline stages of the compressed/window kernel alone), ``sel_desc`` (selected blocks
    through tensor descriptors, where ``l'`` is a power of two, and at least 16 on a GPU), ``topn_per_round`` (keys
    each top-n round takes: 1, 2, 4 or 8; one that does not divide ``n`` becomes 1),
    ``combine_heads`` (heads per combine program on the GPU), ``window_in_selected`` (the window's
    splits as programs of the selected launch), ``win_tile`` (their token tile),
    ``l2_hints`` (logits and partials stored with the L2 policy evict-last and read back,
    once, with evict-first), ``score_mass`` (the compressed pass leaves each tile's block
    masses instead of its logits, where the geometry allows), ``score_warps`` (warps of a score
    program; :func:`default_score_warps`) and ``topn_bitonic`` (the selection programs rank the
    candidates by one bitonic merge of the score tiles' sorted runs where they fit one tile,
    instead of rounds).

    Defaults from Hopper on, measured on an H200 at 64k (graph replay): while the batch
    does not fill the GPU (batch 1), PDL on (26.7 against 29.4 us) and plain loads for the
    compressed pass (descriptors: 26.1 us with contiguous scoring, against 25.4). Once it
    does (batch 16), compressed tiles of 32 tokens through descriptors (the kernel 49.0
    against 54.4 us; 101.1 against 105.2 us for the step, with PDL on). PDL stays on there
    too since session 42 (off from session 4, when it measured 118.5 against 108.2 us at
    batch 16, 64k: programs that started early held SM slots the running launch needed).
    With the one-wave compressed launch, one-warp score programs and the window's programs
    in the selected launch (which then start during the compressed pass), on an H200, us,
    on against off: batch 16 at 8k 40.1 against 42.8-43.0, 16k 46.5-46.8 against 49.1, 32k
    61.0 against 59.3-59.6 (the one loss), 64k 81.4-81.5 against 81.1-81.6; batch 32
    60.3 against 64.5 (8k) to 137.4-137.7 against 142.3 (64k); batch 64 98.1-98.4 against
    101.7-102.0 (8k) to 251.7-252.1 against 256.4-256.5 (64k). At 8k, batch 16, the gain
    needs the score and selected launches both early (40.4 us; either alone 42.6-43.4).
    Contiguous scoring always: 25.4 against 26.7 us at batch 1, 105.2 against 118.5 at
    batch 16. Top-n rounds of 4 keys: 23.7 against 25.5 us (rounds of 1)
    at batch 1, 64k; since session 21 one bitonic top-k instead (H100, graph replay: batch 1
    at 64k 23.6-23.8 against 25.6 us, the selected kernel 5.2-5.3 against 6.9-7.0 us eager; 8k
    16.6-17.4 against 17.5-18.2; batch 16 within 0.3 us either way); since session 44 a merge
    of the score tiles' sorted runs (with the score launch's fast log2, H200: batch 1 at 64k
    21.25-21.47 against 21.92-22.08 us, batch 16 78.94-79.04 against 79.30-79.87). Selected blocks through
    descriptors once the batch fills the GPU:
    97.6 against 100.1 us at batch 16, 64k (the selected kernel 17.8 against 20.6 us).
    ``combine_heads`` 4 once the batch fills the GPU: 93.2 against 98.1 us at batch 16,
    64k (50.1 against 54.7 at 8k). At batch 1 (H200): 4 at 8k, 18.7 against 19.6-19.8 us for 1,
    but 27.6 against 24.4 at 64k, whose 36 slots make the tile of 4 heads too large; 2 there,
    23.9 us. Hence as many heads (8, 4, 2 or 1; 8 since session 45, batch 16 at 8k 38.6-38.8
    against 39.0-39.1 us on an H200) as keep heads x slots (rounded up to a power of two)
    within 128.
    ``window_in_selected`` once the batch fills the GPU (see :func:`default_splits`), and at
    batch 1 for caches of at most 128 blocks (8k), whose compressed splits are a few tiles
    each: there the compressed launch shrinks (3.2 against 4.2 us) and the window's programs
    run beside the selection programs' top-n (H100, 8k: 17.6-18.1 against 18.7-18.9 us; 4k:
    17.9-18.1 against 18.7-18.9; H200, 8k: 17.4-17.6 against 18.3-18.5). At batch 1 and 16k
    no difference, at 32k +0.3 us, and at 64k 30.7-31.2 against 25.7 us (H100): there the
    window's programs ran beside the compressed splits for free, and in the selected launch
    they lengthen it.
    ``l2_hints`` on (H100, graph replay): batch 16 at 8k 50.5-50.6 against 51.7-52.1 us, 16k
    58.6-58.9 against 60.9-61.4, 64k 106.6-107.1 against 107.1-107.2; batch 1 within 0.4 us.
    The compressed launch once the batch fills the GPU takes 3 programs an SM in 3 stages, or 4
    in 2 where the first would need two waves (:func:`fill_cmp_wave`, session 42, H200, PDL on).
    With PDL off, in session 5, 4 programs in 2 stages measured 105.8-106.0 against 106.1-106.5
    us at batch 16, 64k, 50.3-50.7 against 50.8-51.0 at 8k (H100), and on the H200 the other
    way at 64k (88.0-88.1 against 86.8-87.3 us) and the same way at 8k (42.7-42.8 against
    43.1-43.3).
    """
    B, TQ, HQ, K = q.shape
    H, V = k.shape[2], v.shape[3]
    G, rows = HQ // H, B * TQ
    q = last_dim_contiguous(q).reshape(rows, HQ, K)
    gate_proj = isinstance(gates, GateProjection)
    if gate_proj:  # the combine launch computes them: x [rows, hidden], weight [3 * HQ, hidden], bias
        gate_x, gate_w, gate_b = gates.x.reshape(rows, -1), gates.weight, gates.bias
        hidden = gate_x.shape[1]
    else:
        gate_x, gate_w, gate_b, hidden = gates.reshape(rows, HQ, 3).contiguous(), None, None, 0
    k, v, k_cmp, v_cmp, k_win, v_win = (last_dim_contiguous(t) for t in (k, v, k_cmp, v_cmp, k_win, v_win))
    nc_cap, nblk_cap, n = max(k_cmp.shape[1], 1), config.num_sel_blocks(k.shape[1]), config.sel_count
    for name, tile in (("block_tile", block_tile), ("token_tile", token_tile), ("cmp_tile", cmp_tile),
                       ("win_tile", win_tile)):
        if tile is not None and (tile < 1 or tile & (tile - 1)):  # each is a tl.arange's length
            raise ValueError(f"{name} must be a power of two, got {tile}")
    s_cmp, s_win, sb = splits if splits is not None else default_splits(rows * H, nc_cap, config, q.device)
    s_slc = cdiv(n, sb)
    S = s_cmp + s_win + s_slc
    BG, BK, BV = next_pow2(G), next_pow2(K), next_pow2(V)
    BC = token_tile or (64 if max(BK, BV) <= 128 else 32)
    PREC = dot_precision(q.dtype, q.device, max(K, V))
    on_gpu = q.device.type == "cuda"
    fills = _batch_fills_gpu(rows * H, config, q.device)
    if pdl is None:
        pdl = on_gpu and pdl_supported(q.device)
    early = tuple(bool(e) for e in pdl) if isinstance(pdl, (tuple, list)) else (bool(pdl),) * 3
    if len(early) != 3:
        raise ValueError(f"pdl must be a bool or three flags (score, selected, combine launches), got {pdl!r}")
    pdl = any(early)
    if cmp_desc is None:
        cmp_desc = on_gpu and bulk_copies_supported(q.device) and fills
        cmp_tile = cmp_tile or (32 if cmp_desc else None)
    # a descriptor tile is the K of a whole tl.dot, which needs K >= 16 on a GPU (the
    # interpreter has no such limit, so CPU tests use smaller tiles)
    min_dot = min_dot_side(q.device)
    if cmp_tile is not None:
        cmp_tile = max(cmp_tile, min_dot)
    after_score, after_selected, after_combine = (pdl_launch(e) for e in early)
    f32 = dict(device=q.device, dtype=torch.float32)
    # what the compressed pass leaves for scoring: each tile's block masses where the
    # geometry allows (blocks of R = l'/d whole tokens, a power of two; a token reaching at
    # most one block further, l <= l' + d; tiles of whole blocks), else every logit
    tokens_per_block = config.sel_block // config.cmp_stride
    contig_ok = (config.sel_block % config.cmp_stride == 0 and config.cmp_block % config.cmp_stride == 0
                 and tokens_per_block == next_power_of_2(tokens_per_block))  # fmt: skip
    r_blk = tokens_per_block if contig_ok else 1
    cmp_bc = cmp_tile or BC  # the compressed pass's token tile
    if score_mass is None:
        # once the batch fills the GPU, where the compressed pass is bound by its writes:
        # 100.4-101.4 against 104.9-105.2 us at batch 16, 64k (the pass 51.3-51.6 against
        # 55.0-55.1); at batch 1 the extra register work costs more (64k: 26.2-26.4 against
        # 25.6-25.8; 8k: 19.0-19.2 against 18.5-18.7; H100)
        score_mass = fills
    score_mass = (score_mass and score_contig and contig_ok and config.cmp_block <= config.sel_block + config.cmp_stride
                  and cmp_bc % r_blk == 0)  # fmt: skip
    sink_stride = cdiv(nc_cap, cmp_bc) * (cmp_bc // r_blk + 2) if score_mass else nc_cap
    logits = torch.empty(rows * HQ, sink_stride, **f32)
    o_part, m_part, l_part = torch.empty(rows * HQ, S, V, **f32), torch.empty(rows * HQ, S, **f32), torch.empty(rows * HQ, S, **f32)
    block_idx = torch.empty(B, TQ, H, n, device=q.device, dtype=torch.int32)
    o = torch.empty(B, TQ, HQ, V, device=q.device, dtype=q.dtype)
    qk_scale = scale * LOG2E
    common = dict(TQ=TQ, H=H, G=G, BG=BG, PDL=pdl)
    attend = dict(K=K, V=V, BK=BK, BV=BV, BC=BC, PREC=PREC)
    cmp_attend = dict(attend, BC=cmp_bc)
    k_cmp_arg, v_cmp_arg, k_win_arg, v_win_arg = k_cmp, v_cmp, k_win, v_win
    if cmp_desc:
        k_cmp, v_cmp = descriptor_ready(k_cmp), descriptor_ready(v_cmp)
        k_cmp_arg, v_cmp_arg = token_tile_descriptor(k_cmp, cmp_attend["BC"], BK), token_tile_descriptor(v_cmp, cmp_attend["BC"], BV)
    if win_desc:
        k_win, v_win = descriptor_ready(k_win), descriptor_ready(v_win)
        k_win_arg, v_win_arg = token_tile_descriptor(k_win, cmp_attend["BC"], BK), token_tile_descriptor(v_win, cmp_attend["BC"], BV)
    if cmp_stages is None and fills:
        _, cmp_stages = fill_cmp_wave(rows * H, q.device)
    cmp_stages = pipeline_stages(cmp_stages, q.dtype, q.device, max(K, V))
    exact = exact_float32(q.dtype, q.device, max(K, V))
    if cmp_stages is None and exact:
        # exact float32 tiles of head dim 128 in Triton's default 3 stages ask 264 KiB, past an
        # H100's 227 (out of resources at the launch); one stage asks 72 KiB, two 136 with spills
        # (sm_90 and sm_80 compiles, docs/perf/other_gpus.md)
        cmp_stages = 1
    stages = dict(num_stages=cmp_stages) if cmp_stages else {}
    # the selected pass likewise: 140 KiB in 3 stages, past a consumer GPU's 99; 72 in one
    sel_stages = dict(num_stages=1) if exact else {}
    if window_in_selected is None:
        # at batch 1 only for short caches, whose compressed pass is a few tiles a split
        window_in_selected = fills or nblk_cap <= 128
    if l2_hints is None:
        l2_hints = on_gpu
    keep, drop = ("evict_last", "evict_first") if l2_hints else ("", "")
    decode_cmp_win_fwd_kernel[(s_cmp + (0 if window_in_selected else s_win), rows * H)](
        q, k_cmp_arg, v_cmp_arg, k_win_arg, v_win_arg, seq_lens, k_cmp, v_cmp, k_win, v_win,  #
        logits, o_part, m_part, l_part,  #
        q.stride(0), q.stride(1),  #
        k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2), v_cmp.stride(0), v_cmp.stride(1), v_cmp.stride(2),  #
        k_win.stride(0), k_win.stride(1), k_win.stride(2), v_win.stride(0), v_win.stride(1), v_win.stride(2),  #
        qk_scale, sink_stride, s_cmp, s_win, S,  #
        CMP_BLOCK=config.cmp_block, CMP_STRIDE=config.cmp_stride, WINDOW=config.window, CMP_DESC=cmp_desc, WIN_DESC=win_desc,
        KEEP=keep, MASS=score_mass, SEL_BLOCK=config.sel_block, R=r_blk,
        num_warps=cmp_warps or num_warps, **cmp_attend, **common, **stages, **LAUNCH_OPTIONS,
    )  # fmt: skip
    if score_blocks is None:
        # 64-block tiles where they halve a batch-1 row's candidates to 32 (at most 128
        # blocks, 8k at l' = 64: 20.2-20.4 against 21.2 us on an H100; the selected kernel's
        # top-n 5.0 against 6.2 us), or hold the whole row (4k: no top-n rounds at all,
        # 16.4-16.6 against 17.2-17.4 us, H200); at 16k and over, and at batch 16, no gain
        # or a loss; one tile of 128 (8k) measured 18.8 against 17.5 us
        score_blocks = 64 if not fills and nblk_cap <= 128 else 32
    BJ = next_pow2(score_blocks, 2)
    score_tiles = cdiv(nblk_cap, BJ)
    NP = next_pow2(n, 2)
    n_cand = score_tiles * NP  # NP candidate slots per score tile
    cand = torch.empty(rows * H, n_cand, device=q.device, dtype=torch.int64)
    tj = block_tile or min(1024, next_pow2(n_cand))
    one_tile, ranked = n_cand <= tj, score_tiles == 1
    # one bitonic merge of sorted runs needs every candidate in registers
    topn_bitonic = topn_bitonic and one_tile and not ranked
    decode_score_kernel[(score_tiles, rows * H)](
        seq_lens, logits, m_part, l_part, cand,  #
        sink_stride, n_cand, s_cmp, S,  #
        CMP_BLOCK=config.cmp_block, CMP_STRIDE=config.cmp_stride, SEL_BLOCK=config.sel_block,
        N=n, NP=NP, INIT=config.init_blocks, LOCAL=config.local_blocks,
        BSC=next_pow2(s_cmp, 2), BJ=BJ, NCOVER=(config.sel_block + config.cmp_block) // config.cmp_stride - 1,
        CONTIG=score_contig and contig_ok, R=r_blk, DROP=drop, MASS=score_mass, CMP_TILE=cmp_bc, SORTED=topn_bitonic,
        FAST_LOG2=on_gpu,
        num_warps=score_warps or default_score_warps(score_tiles * rows * H, q.device), **common, **after_score,
        **UNFUSED_LAUNCH_OPTIONS,  # each key is ranked against the copies of its tile's keys in other lanes
    )  # fmt: skip
    sel_block = config.sel_block
    if sel_desc is None:
        sel_desc = on_gpu and bulk_copies_supported(q.device) and fills
    sel_desc = sel_desc and sel_block == next_power_of_2(sel_block) and sel_block >= min_dot
    per_round = topn_per_round or 4
    per_round = per_round if per_round in (1, 2, 4, 8) and n % per_round == 0 else 1
    d_k = d_v = k  # unused without SEL_DESC
    if sel_desc:
        k, v = descriptor_ready(k), descriptor_ready(v)
        d_k, d_v = token_tile_descriptor(k, sel_block, BK), token_tile_descriptor(v, sel_block, BV)
    decode_selected_fwd_kernel[(s_slc + (s_win if window_in_selected else 0), rows * H)](
        q, k, v, seq_lens, cand, block_idx, k_win, v_win,  #
        o_part, m_part, l_part,  #
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),  #
        k_win.stride(0), k_win.stride(1), k_win.stride(2), v_win.stride(0), v_win.stride(1), v_win.stride(2),  #
        qk_scale, n_cand, s_cmp + s_win, S, s_slc, s_win, s_cmp,  #
        SEL_BLOCK=sel_block, N=n, NP=NP, SB=sb, BJ=BJ, TJ=tj, ONE_TILE=one_tile,
        PER_ROUND=per_round, SEL_DESC=sel_desc, SMALL_TILE=min(16, BC), d_k=d_k, d_v=d_v,
        WIN=window_in_selected, WINDOW=config.window, WIN_TILE=max(win_tile or BC, min_dot), KEEP=keep,
        RANKED=ranked, BITONIC=topn_bitonic, num_warps=num_warps, **sel_stages, **attend, **common, **after_selected,
        **LAUNCH_OPTIONS,
    )  # fmt: skip
    if combine_heads is None:
        # up to 8 heads a program while its (head, slot) tile stays within 128 rows (see above):
        # batch 1 (36 slots, padded to 64) takes 2, batch 16 (12 slots) 8
        combine_heads = next(hb for hb in (8, 4, 2, 1) if (HQ % hb == 0 and hb * next_pow2(S, 2) <= 128) or hb == 1)
    if HQ % combine_heads:
        raise ValueError(f"combine_heads={combine_heads} must divide the {HQ} query heads")
    hb = combine_heads if on_gpu else G  # the interpreter prefers fewer, larger programs
    decode_combine_kernel[(rows * HQ // hb,)](
        o_part, m_part, l_part, gate_x, o, gate_w if gate_proj else gate_x, gate_b if gate_b is not None else gate_x,  #
        s_cmp, s_win, S, HQ, hidden, gate_x.stride(0),  #
        V=V, HB=hb, BS=next_pow2(S, 2), BSX=min(next_pow2(combine_chunk, 2), next_pow2(S, 2)), BV=next_pow2(V, 2), PDL=pdl, DROP=drop,
        GATE_PROJ=gate_proj, BKG=min(512, next_power_of_2(max(hidden, 1))), HAS_BIAS=gate_b is not None,
        **after_combine, **LAUNCH_OPTIONS,
    )  # fmt: skip
    return o, block_idx


def nsa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: Union[torch.Tensor, GateProjection],
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
