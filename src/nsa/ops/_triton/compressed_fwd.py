"""Forward of compressed attention, fused with block scoring.

One program owns a tile of ``BT`` query positions and all ``G`` query heads of
one KV head (``M = BT * GP`` rows, heads padded to ``GP``), so every compressed
key tile it loads serves the whole group. Up to two passes over the visible
compressed tokens:

1. online softmax: ``lse`` and ``o`` per row;
2. only with ``SELECT``: recompute ``p = exp2(s - lse)`` (exact probabilities
   over the visible past), map the compressed tokens onto selection blocks (the
   spec's mass-conserving overlap), sum the masses over the heads of the group
   and store them. ``[T, Nc]`` never reaches memory: the masses,
   ``[T, H, planes, Nsel]`` (half the size of the group scores ``[T, H, Nc]``
   at the paper's defaults), are written for a bounded chunk of queries at a time and turned
   into ``block_idx`` by :mod:`nsa.ops._triton.block_topn`.

Both passes run in one program, or, where the walks are long, pass 1 over every query and then
pass 2 in launches of its own, whose programs need neither ``p @ v``'s accumulator nor V's tiles
and so fit more to an SM (:data:`PASS2_APART`; the same results bitwise). On Hopper those two run
as Gluon kernels instead (:mod:`nsa.ops.compressed.gluon_pass1`, :mod:`nsa.ops.compressed.gluon_scores`).

Pass 2 walks selection blocks in steps of ``NB``: a step covers the compressed
tokens whose first raw position lies in those blocks, ``RP`` a block (``R =
sel_block / cmp_stride`` tokens, padded to a power of two), in the column order of
:func:`_step_tokens`, which keeps a block's tokens in one thread's registers. A
token may straddle a block boundary; the mass it puts ``s`` blocks further goes
to plane ``s``, indexed by the block it lands in, and the top-n kernel adds the
planes block by block. Nothing is carried from one step to the next.

Selection used to keep a running top-n in registers, merged step by step; that
merge was a data-dependent serial loop and cost more than the attention itself
at 64k tokens (docs/perf/compressed_select.md). Storing the masses and ranking
them in a separate, fully parallel kernel is cheaper.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from nsa.config import NSAConfig
from nsa.ops._triton.attention import (
    LOG2E,
    attn_fwd_finish,
    attn_fwd_step,
    descriptor_ready,
    dot_precision,
    exact_float32_tiles,
    hopper_tiles_fit,
    next_pow2,
    pipeline_stages,
    token_tile,
    token_tile_descriptor,
)
from nsa.ops._triton.device import bulk_copies_supported
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2
from nsa.ops.compressed import gluon_pass1, gluon_scores

# the score buffer of one launch stays under this; longer inputs run in query chunks
SCORE_BUFFER_BYTES = 256 * 1024 * 1024

#: Launch options where no query sees more than :data:`SHORT_TOKENS` compressed tokens (16-bit
#: inputs, heads up to 128 wide): 32-token pass-1 tiles, 16 blocks a pass-2 step, 2 stages and at
#: most 128 registers a thread (6 bytes spill), so that 4 programs share an SM (50 KB of shared
#: memory each) instead of 2 (187 registers, 113 KB). Walks of a few tiles leave little to
#: pipeline, and the extra programs hide one another's waits; over long walks the wider tiles win.
#: H100, the launch with selection, ms (docs/perf/prefill.md, session 20): 8k 0.393-0.394 against
#: 0.472-0.476, 16k 1.308-1.312 against 1.418-1.420; with the short tiles for every query, 32k
#: 4.868 against 4.878 and 64k 19.14 against 18.34-18.36.
SHORT_TILES = dict(block_n=32, blocks_per_step=16, num_stages=2, maxnreg=128)
SHORT_TOKENS = 1024
#: Where both passes apart run as Gluon kernels (Hopper: :mod:`nsa.ops.compressed.gluon_pass1`,
#: :mod:`nsa.ops.compressed.gluon_scores`), the short walks' fused launch takes only queries that see
#: at most this many compressed tokens. H200, session 69, the forward with the passes apart against the
#: fused launch: 16k (1023 tokens) 4.98-5.04 ms against 5.07-5.14, 8k (511) 2.18-2.21 against 2.14-2.19;
#: session 70: 16k 5.03-5.04 against 5.13-5.14, 12k (767) 3.56-3.60 against 3.55-3.62, 8k 2.17-2.20
#: against 2.14-2.17.
GLUON_SHORT_TOKENS = 512


def short_walk_tokens(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, config: NSAConfig) -> int:
    """The most compressed tokens a query of a call may see for the call to take the short walks' fused
    launch: :data:`GLUON_SHORT_TOKENS` where pass 1 and the scoring pass would both run as Gluon kernels,
    :data:`SHORT_TOKENS` elsewhere (the Triton launches' own tiles). Asks both kernels as the passes'
    dispatch below does (the scoring pass with :func:`_score_geometry`'s tokens a block)."""
    gluon = gluon_pass1.fits(q, k_cmp, v_cmp) and gluon_scores.fits(q, k_cmp, _score_geometry(config)["R"])
    return GLUON_SHORT_TOKENS if gluon else SHORT_TOKENS

#: Pass 2 as a launch of its own (``enabled``) where the launch selects, stores ``o`` and takes the
#: long walks' default tiles (not :data:`SHORT_TILES`, nor a caller's) on a GPU where the tiles
#: tuned on Hopper fit (``hopper_tiles_fit``: 16-bit heads up to 128 wide, 227 KiB a program): pass
#: 1 runs once over every query and leaves the log2-domain lse, then each query chunk's pass 2, with
#: these options (``rows`` None: pass 1's; ``pass1``: launch options of pass 1 over the fused
#: launch's, ``rows``, ``BN``, ``num_warps``, ``num_stages``, ``maxnreg``), and its top-n; bitwise the
#: fused launch's results where ``pass1`` keeps the fused launch's ``BN``.
#: Without ``p @ v`` and its accumulator, pass 2 alone needs fewer registers and less shared memory:
#: compiled for sm_90 (head dim 128) the fused kernel takes 187 registers and 113 KiB (2 programs of
#: 4 warps an SM), pass 2 alone in tiles of 128 rows (8 query positions), 16-block steps and 2
#: stages 76 and 64 KiB (3 programs of 8 warps). H200, the compressed forward with selection, ms:
#: 64k 16.63-17.21 against 17.43-17.94 fused (64 rows of 4 warps 17.18-17.67, 32 blocks a step
#: 17.62-18.00, 256 rows 18.14-18.80), 32k 4.57 against 4.87-4.95; the whole 64k forward 33.61-33.88
#: against 34.16-34.78 (ABBA) (docs/perf/prefill.md, session 56).
#: Pass 1 alone takes 128 rows (8 query positions) of 8 warps in 2 stages, capped at 128 registers,
#: so that two programs share an SM (128 registers, 96 KiB for sm_90; ptxas then waits for each
#: product of a group, 24 bytes of stack outside the loop) and each K/V tile from L2 serves twice
#: the rows of the fused launch's tiles (174 registers, 112 KiB, 64 rows). H200, the compressed
#: forward with selection: 64k 16.37-16.49 ms against 17.15-17.34 with the fused launch's tiles for
#: pass 1, 32k 4.44 against 4.65-4.70; the whole 64k forward 33.18-33.50 against 33.81-34.29,
#: forward+backward 97.19-97.62 against 97.41-99.12 (ABBA); bitwise the same results. Uncapped (191
#: registers, one program an SM) 17.54-17.67, and 32-token tiles 17.17-18.73 (sessions 56-57).
#: Its whole key/value tiles come through tensor descriptors (``kv_desc``, where the GPU has bulk
#: copies): compiled for sm_90 the unmasked step takes 353 instructions against 383 with pointer loads
#: (128 registers either way). H200, 64k: the compressed forward with selection 15.89-15.97 ms against
#: 16.19-16.22, its kernels 14.03-14.20 against 14.29-14.39; the whole forward 32.66-32.83 against
#: 32.61-33.14 and forward+backward 95.93-96.32 against 96.09-96.48 (ABBA, faster in 3 and 4 of the
#: 4 rounds); bitwise the same results (session 59).
#: The waits are ptxas's note C7512 (wgmma serialised for want of registers), which session 62's GPU
#: test read; no launch without it is faster (H200, the compressed forward with selection, through
#: descriptors: 64k 15.94-16.15 ms against 16.91-17.21 in 32-token tiles of 3 stages, 17.73-17.81 in
#: 2, 22.71 in 16-token tiles, 17.63-17.72 in 64-token tiles capped at 144 or 168 registers; 32k
#: 4.37 against 4.60-6.01). tests/ops/test_wgmma_serialisation.py holds it as its one exception.
PASS2_APART = dict(enabled=True, blocks_per_step=16, num_warps=8, num_stages=2, maxnreg=None, rows=128,
                   pass1=dict(rows=128, num_warps=8, num_stages=2, maxnreg=128, kv_desc=True))


@triton.jit
def visible_cmp(t, NC, L: tl.constexpr, S: tl.constexpr):
    """Compressed tokens visible at positions ``t`` (spec ``Nc(t)``), capped at ``NC``.
    Written with where(): integer division truncates toward zero for negatives."""
    n = tl.where(t + 1 >= L, (t + 1 - L) // S + 1, 0)
    return tl.minimum(n, NC)


@triton.jit
def group_rows(i_b, i_t, i_h, TQ, H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr):
    """The ``M = BT * GP`` rows of query tile ``i_t`` and KV head ``i_h``: row ``m`` is query
    ``i_t * BT + m // GP`` and head ``i_h * G + m % GP``.

    Returns ``(o_tq [M] query index, m_row [M] real rows, o_q [M] int64 row of [B*TQ*HQ])``.
    """
    o_m = tl.arange(0, BT * GP)
    o_tq = i_t * BT + o_m // GP
    m_row = (o_tq < TQ) & (o_m % GP < G)
    o_q = (i_b.to(tl.int64) * TQ + o_tq) * (H * G) + i_h * G + o_m % GP
    return o_tq, m_row, o_q


@triton.jit
def _lse_step(b_q, b_k, b_m, b_l, m_qk, qk_scale, MASK: tl.constexpr, PREC: tl.constexpr):
    """Online max and sum with one key tile (no values): ``b_k [BN, BK]``."""
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)  # [M, BN], scaled as in attn_fwd_step
    if MASK:
        b_s = tl.where(m_qk, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1) * qk_scale)
    b_shift = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_l = b_l * tl.exp2(b_m - b_shift) + tl.sum(tl.exp2(b_s * qk_scale - b_shift[:, None]), 1)
    return b_m_new, b_l


@triton.jit
def _softmax_chunk(
    b_q, p_k, p_v, i_n, n_hi, nv, b_acc, b_m, b_l, qk_scale,
    BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    HDK: tl.constexpr, HDV: tl.constexpr, MASK: tl.constexpr, STORE_O: tl.constexpr, PREC: tl.constexpr,
    d_k=None, d_v=None, i_b=0, i_h=0, KV_DESC: tl.constexpr = False,
):
    """Pass-1 step over tokens ``[i_n, i_n + BN)``: online max/sum, and ``o`` when ``STORE_O``.

    p_k/p_v point at token 0 of this (batch, KV head); HDK/HDV are the token strides. With
    ``KV_DESC`` (unmasked steps only) the tiles come through the tensor descriptors ``d_k``/``d_v``
    of the whole caches (block ``[1, BN, 1, BDK|BDV]``) instead.
    """
    o_n = i_n + tl.arange(0, BN)
    o_dk = tl.arange(0, BDK)
    # tokens past n_hi exist only in masked steps: unmasked ones load whole tiles
    m_n = (o_n < n_hi) | (not MASK)
    if KV_DESC:
        b_k = token_tile(d_k, i_b, i_n, i_h, BN, BDK)
    else:
        b_k = tl.load(p_k + (o_n.to(tl.int64) * HDK)[:, None] + o_dk[None, :],
                      mask=m_n[:, None] & (o_dk < DK)[None, :], other=0.0)  # [BN, BDK]
    m_qk = o_n[None, :] < nv[:, None]  # [M, BN]
    if STORE_O:
        o_dv = tl.arange(0, BDV)
        if KV_DESC:
            b_v = token_tile(d_v, i_b, i_n, i_h, BN, BDV)
        else:
            b_v = tl.load(p_v + (o_n.to(tl.int64) * HDV)[:, None] + o_dv[None, :],
                          mask=m_n[:, None] & (o_dv < DV)[None, :], other=0.0)  # [BN, BDV]
        b_acc, b_m, b_l = attn_fwd_step(b_q, b_k, b_v, b_acc, b_m, b_l, m_qk, qk_scale, MASK, PREC)
    else:
        b_m, b_l = _lse_step(b_q, b_k, b_m, b_l, m_qk, qk_scale, MASK, PREC)
    return b_acc, b_m, b_l


@triton.jit
def _step_tokens(i_j, NB: tl.constexpr, R: tl.constexpr, RP: tl.constexpr):
    """Block ``jb``, token ``r`` of it, and the token index of each of the ``NB * RP`` columns of a
    pass-2 step at blocks ``[i_j, i_j + NB)``, in the column order ``[JH, RH, JL, RL]`` (block
    ``jb = jh * JL + jl``, token ``r = rh * RL + rl``).

    Why that order: in the tensor-core layout of a ``[M, NB * RP]`` score tile a thread holds
    column pairs (the ``RL`` bit), four lanes hold neighbouring pairs (the ``JL`` bits) and the
    higher column bits are the thread's registers again. With a block's tokens on the register
    bits, the block masses are sums inside each thread; only the head sum crosses lanes.
    (With blocks in order and their tokens side by side, an unmasked step at the paper's
    geometry took 616 instructions, 128 of them shuffles; in this order 457 and 48, and the
    whole kernel 6-7 % less time at 64k: docs/perf/prefill.md, session 14.)"""
    RL: tl.constexpr = 2 if RP >= 2 else 1
    RH: tl.constexpr = RP // RL
    JL: tl.constexpr = 4 if NB >= 4 else NB
    o_c = tl.arange(0, NB * RP)
    rl = o_c % RL
    jl = (o_c // RL) % JL
    rh = (o_c // (RL * JL)) % RH
    jh = o_c // (RL * JL * RH)
    jb = jh * JL + jl
    r = rh * RL + rl
    return jb, r, (i_j + jb) * R + r


@triton.jit
def _block_mass(b_p, SHIFT: tl.constexpr, M: tl.constexpr, NB: tl.constexpr, R: tl.constexpr,
                RP: tl.constexpr, KC: tl.constexpr):
    """Mass that the tokens of each block of a step put into the block ``SHIFT`` places later.

    Args:
        b_p: ``[M, NB * RP]`` probabilities in the column order of :func:`_step_tokens`.
    Returns ``[M, NB]``, indexed by the tokens' own block ``jb`` (spec Eq. 9: a token
    covers units ``[r, r + KC)``, the block ``[SHIFT*R, SHIFT*R + R)``, weight = overlap / KC).
    """
    RL: tl.constexpr = 2 if RP >= 2 else 1  # the split of _step_tokens
    RH: tl.constexpr = RP // RL
    JL: tl.constexpr = 4 if NB >= 4 else NB
    JH: tl.constexpr = NB // JL
    o_r = tl.arange(0, RH)[:, None] * RL + tl.arange(0, RL)[None, :]  # [RH, RL]
    w = tl.minimum(o_r + KC, SHIFT * R + R) - tl.maximum(o_r, SHIFT * R)
    w = tl.where((o_r < R) & (w > 0), w, 0).to(tl.float32)[None, None, :, None, :] / KC
    # the weights are constants per register: tokens of weight 0 add -0.0, which the compiler
    # drops (x + -0.0 == x exactly), and weight 1 multiplies by nothing
    b_w = tl.where(w > 0, tl.reshape(b_p, [M, JH, RH, JL, RL]) * w, -0.0)
    return tl.reshape(tl.sum(tl.sum(b_w, 4), 2), [M, NB])


@triton.jit
def _score_step(
    b_q, p_k, i_j, nv, n_hi, b_lse, m_row, qk_scale, p_sc, m_t, NSEL,
    BT: tl.constexpr, GP: tl.constexpr, NB: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    KC: tl.constexpr, NSPILL: tl.constexpr, BDK: tl.constexpr, DK: tl.constexpr, HDK: tl.constexpr,
    MASK: tl.constexpr, PREC: tl.constexpr,
):
    """Block masses of the tokens whose first raw position lies in blocks ``[i_j, i_j + NB)``
    (columns in the order of :func:`_step_tokens`). Without ``MASK`` every row sees every token
    of the step and the scores go unmasked: padding rows carry ``lse = +inf``, so their
    probabilities are 0 either way. Each row's masses are summed over the group's heads last
    (Eq. 10), on ``NB`` values a row instead of ``NB * RP``."""
    M: tl.constexpr = BT * GP
    o_dk = tl.arange(0, BDK)
    _, o_r, o_tok = _step_tokens(i_j, NB, R, RP)  # [NB * RP]
    p_tok = p_k + (o_tok.to(tl.int64) * HDK)[:, None] + o_dk[None, :]
    if MASK:
        m_tok = (o_r < R) & (o_tok < n_hi)
        b_k = tl.load(p_tok, mask=m_tok[:, None] & (o_dk < DK)[None, :], other=0.0)  # [NB * RP, BDK]
    else:
        b_k = tl.load(p_tok, mask=(o_dk < DK)[None, :], other=0.0)
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale - b_lse[:, None]  # [M, NB * RP]
    if MASK:
        # mask before the exponential, not after: an invisible score may exceed lse; masked
        # after the subtraction, which then stays fused with the scaling
        b_s = tl.where(m_row[:, None] & m_tok[None, :] & (o_tok[None, :] < nv[:, None]), b_s, float("-inf"))
    b_p = tl.exp2(b_s)
    o_blk = i_j + tl.arange(0, NB)
    for shift in tl.static_range(NSPILL):
        b_mass = tl.sum(tl.reshape(_block_mass(b_p, shift, M, NB, R, RP, KC), [BT, GP, NB]), 1)  # [BT, NB]
        # at the block the mass lands in: the top-n reads the planes aligned (``block_topn``)
        o_dst = o_blk + shift
        tl.store(p_sc[:, None] + shift * NSEL + o_dst[None, :], b_mass, mask=m_t[:, None] & (o_dst < NSEL)[None, :])


@triton.jit
def _score_pass(
    b_q, p_k, nv, n_lo, n_hi, b_lse, m_row, t_last, qk_scale, p_sc, m_t, NSEL,
    BT: tl.constexpr, GP: tl.constexpr, NB: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    KC: tl.constexpr, NSPILL: tl.constexpr, SEL: tl.constexpr,
    BDK: tl.constexpr, DK: tl.constexpr, HDK: tl.constexpr, PREC: tl.constexpr,
):
    """Pass 2: exact probabilities, then block masses to ``p_sc``.

    The mass a block's tokens put into the block ``s`` places later goes to plane ``s``
    of the score row (``[NSPILL, NSEL]``, indexed by the block it lands in); the top-n kernel
    adds the planes block by block. No value is carried from one step to the next.
    (``o`` comes from pass 1: adding ``p @ v`` here instead measured 1 ms slower at 64k.)
    Steps whose tokens every row of the tile sees (all but the last one or two, where
    ``R`` needs no padding) run without masks.

    Args:
        nv: ``[M]`` visible tokens per row; n_lo/n_hi: the fewest/most any row sees;
            b_lse: ``[M]`` log2-domain lse (``+inf`` on padding rows); m_row: ``[M]`` real
            rows; p_sc: ``[BT]`` score rows; m_t: ``[BT]`` real queries; NSEL: blocks per plane.
    """
    full_end = (n_lo // (NB * R)) * NB if R == RP else 0  # blocks of the unmasked steps
    for i_j in range(0, full_end, NB):
        _score_step(b_q, p_k, i_j, nv, n_hi, b_lse, m_row, qk_scale, p_sc, m_t, NSEL,
                    BT, GP, NB, R, RP, KC, NSPILL, BDK, DK, HDK, False, PREC)
    for i_j in range(full_end, t_last // SEL + 1, NB):
        _score_step(b_q, p_k, i_j, nv, n_hi, b_lse, m_row, qk_scale, p_sc, m_t, NSEL,
                    BT, GP, NB, R, RP, KC, NSPILL, BDK, DK, HDK, True, PREC)


@triton.jit(do_not_specialize=["TQ", "NC", "q_offset", "T0", "T1", "NSEL"])
def compressed_fwd_kernel(
    q,  # [B, TQ, HQ, DK]
    k,  # [B, NC, H, DK]
    v,  # [B, NC, H, DV]
    o,  # [B, TQ, HQ, DV]
    lse,  # [B, TQ, HQ] float32, natural log
    scores,  # [B, T1 - T0, H, NSPILL, NSEL] float32 block masses of queries T0 .. T1 - 1
    TQ, NC, q_offset, qk_scale, T0, T1, NSEL,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
    L: tl.constexpr, S: tl.constexpr, SEL: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    KC: tl.constexpr, NSPILL: tl.constexpr, NB: tl.constexpr,
    STORE_O: tl.constexpr, SELECT: tl.constexpr, PREC: tl.constexpr,
    lse2=None,  # [B, TQ, HQ] float32 log2-domain lse: written with LSE2_OUT, read without PASS1
    PASS1: tl.constexpr = True, LSE2_OUT: tl.constexpr = False,
    d_k=None, d_v=None, KV_DESC: tl.constexpr = False,  # pass 1's whole tiles through descriptors
):
    """Grid ``(query tiles of [T0, T1), B * H)``. Without ``PASS1`` only pass 2 runs, from the
    log2-domain lse that a ``PASS1`` launch with ``LSE2_OUT`` left in ``lse2``
    (:data:`PASS2_APART`)."""
    M: tl.constexpr = BT * GP
    # queries [T0, T1) with T0 a multiple of BT; the last tiles see the most tokens: launch them first
    i_t = T0 // BT + tl.cdiv(T1 - T0, BT) - 1 - tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_tq, m_row, o_q = group_rows(i_b, i_t, i_h, TQ, H, G, GP, BT)
    m_row = m_row & (o_tq < T1)
    o_dk = tl.arange(0, BDK)
    b_q = tl.load(q + (o_q * DK)[:, None] + o_dk[None, :], mask=m_row[:, None] & (o_dk < DK)[None, :], other=0.0)
    nv = visible_cmp(q_offset + o_tq, NC, L, S)  # [M]
    t_last = q_offset + tl.minimum(i_t * BT + BT, T1) - 1
    n_lo = visible_cmp(q_offset + i_t * BT, NC, L, S)
    n_hi = visible_cmp(t_last, NC, L, S)
    p_k = k + (i_b.to(tl.int64) * NC * H + i_h) * DK
    p_v = v + (i_b.to(tl.int64) * NC * H + i_h) * DV
    if PASS1:
        # -- pass 1: online softmax, lse and o --
        b_m = tl.full([M], float("-inf"), dtype=tl.float32)
        b_l = tl.zeros([M], dtype=tl.float32)
        b_acc = tl.zeros([M, BDV], dtype=tl.float32)
        n_full = (n_lo // BN) * BN
        for i_n in range(0, n_full, BN):
            b_acc, b_m, b_l = _softmax_chunk(b_q, p_k, p_v, i_n, n_hi, nv, b_acc, b_m, b_l, qk_scale,
                                             BN, BDK, BDV, DK, DV, H * DK, H * DV, False, STORE_O, PREC,
                                             d_k, d_v, i_b, i_h, KV_DESC)
        for i_n in range(n_full, n_hi, BN):
            b_acc, b_m, b_l = _softmax_chunk(b_q, p_k, p_v, i_n, n_hi, nv, b_acc, b_m, b_l, qk_scale,
                                             BN, BDK, BDV, DK, DV, H * DK, H * DV, True, STORE_O, PREC)
        b_o, b_lse = attn_fwd_finish(b_acc, b_m, b_l)
        # stored before pass 2, so that o's registers are free there
        if STORE_O:
            o_dv = tl.arange(0, BDV)
            tl.store(o + (o_q * DV)[:, None] + o_dv[None, :], b_o.to(o.dtype.element_ty),
                     mask=m_row[:, None] & (o_dv < DV)[None, :])
            tl.store(lse + o_q, b_lse * 0.6931471805599453, mask=m_row)
        if LSE2_OUT:
            tl.store(lse2 + o_q, b_lse, mask=m_row)
    else:
        b_lse = tl.load(lse2 + o_q, mask=m_row, other=0.0)  # padding rows shift by +inf below
    # -- pass 2: exact probabilities -> block masses --
    if SELECT:
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T1
        p_sc = scores + ((i_b.to(tl.int64) * (T1 - T0) + (o_t - T0)) * H + i_h) * (NSPILL * NSEL)  # [BT]
        # a row with lse = -inf sees nothing and is masked everywhere: shift it by 0, not -inf;
        # a padding row shifts by +inf, so that its probabilities are 0 in unmasked steps too
        b_lse_safe = tl.where(m_row, tl.where(b_lse == float("-inf"), 0.0, b_lse), float("inf"))
        _score_pass(b_q, p_k, nv, n_lo, n_hi, b_lse_safe, m_row, t_last, qk_scale, p_sc, m_t, NSEL,
                    BT, GP, NB, R, RP, KC, NSPILL, SEL, BDK, DK, H * DK, PREC)


#: The most compressed tokens one pass-2 step scores (``NB * RP``): the paper's geometry's 32 blocks of
#: 4 tokens. More blocks of more tokens (``sel_block / cmp_stride`` of 8: 256 tokens a step) needed
#: 289 KiB of shared memory for 192-wide heads on an H200, which has 227 (the fuzzer, session 79).
SCORE_STEP_TOKENS = 128


def _score_geometry(config: NSAConfig, blocks_per_step: Optional[int] = None) -> dict:
    """Constexprs of pass 2: tokens per block ``R`` (padded ``RP``), tokens per compressed
    block ``KC``, spill steps, and the blocks scored per step ``NB``."""
    R = config.sel_block // config.cmp_stride
    KC = config.cmp_block // config.cmp_stride
    RP = next_power_of_2(R)
    NSPILL = (R + KC - 2) // R + 1  # block offsets a token's units can reach
    # 32 blocks a step measured ~4% faster than 16 at 64k on an H200 and equal at 8k;
    # NB * RP >= 16 for tl.dot, and at most SCORE_STEP_TOKENS where a block holds fewer tokens
    NB = max(min(blocks_per_step or 32, max(1, SCORE_STEP_TOKENS // RP)), cdiv(16, RP))
    return dict(R=R, RP=RP, KC=KC, NSPILL=NSPILL, NB=next_power_of_2(NB))


def query_chunk(B: int, TQ: int, H: int, nsel: int, BT: int, budget: int = SCORE_BUFFER_BYTES) -> int:
    """Queries per launch so that ``B * chunk * H * nsel`` float32 values (``nsel`` counting
    every plane) fit ``budget``; a multiple of the query tile ``BT`` (at least one tile)."""
    per_query = max(1, B * H * nsel * 4)
    chunk = max(BT, (budget // per_query) // BT * BT)
    return min(chunk, cdiv(TQ, BT) * BT)


def compressed_fwd(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    config: NSAConfig,
    scale: float,
    q_offset: int,
    *,
    store_o: bool = True,
    select: bool = False,
    rows: Optional[int] = None,
    block_n: Optional[int] = None,
    blocks_per_step: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
    maxnreg: Optional[int] = None,
    score_buffer_bytes: int = SCORE_BUFFER_BYTES,
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Launch the fused forward on contiguous inputs.

    Args:
        q: ``[B, Tq, HQ, Dk]``; k_cmp: ``[B, Nc, H, Dk]``; v_cmp: ``[B, Nc, H, Dv]``.
        store_o: compute ``o`` and ``lse``; select: compute ``block_idx``.
        rows: query rows ``M = BT * GP`` per program (default 64); block_n: pass-1
            token tile (default 64; both exact float32's own, :func:`exact_float32_tiles`);
            blocks_per_step: selection blocks scored per pass-2 step (default 32);
            num_warps/num_stages: launch options (defaults from the shapes); maxnreg: a cap
            on registers a thread (Triton's launch option; none by default). Where none of
            block_n, blocks_per_step, num_stages and maxnreg is given and no query sees more
            than :func:`short_walk_tokens` compressed tokens, the launch takes :data:`SHORT_TILES`
            (16-bit inputs, heads up to 128 wide); where none of the tiles is given and queries
            see more, pass 2 may run in launches of its own (:data:`PASS2_APART`);
            score_buffer_bytes: cap on the block-score buffer (queries run in chunks).

    Returns:
        ``(o [B, Tq, HQ, Dv] in q's dtype, lse [B, Tq, HQ] float32, block_idx
        [B, Tq, H, sel_count] int32)``, each ``None`` when not asked for.
    """
    from nsa.ops._triton.block_topn import block_topn

    B, TQ, HQ, DK = q.shape
    NC, H, DV = k_cmp.shape[1], k_cmp.shape[2], v_cmp.shape[3]
    G = HQ // H
    GP = next_power_of_2(G)
    callers_tiles = (rows, block_n, blocks_per_step, num_warps, num_stages, maxnreg) != (None,) * 6
    # 64 rows, 4 warps measured fastest on H100/H200 at 8k-64k tokens (docs/perf/compressed_select.md);
    # a third pipeline stage fits shared memory for 16-bit heads up to 128 wide
    defaults = exact_float32_tiles(q.dtype, q.device, max(DK, DV)) or dict(rows=64, BN=64, num_warps=None)
    rows = rows or defaults["rows"]
    BT = max(1, rows // GP)
    narrow_16bit = max(DK, DV) <= 128 and q.dtype != torch.float32
    short_walks = (block_n, blocks_per_step, num_stages, maxnreg) == (None,) * 4 and narrow_16bit and \
        config.num_cmp(q_offset + TQ) <= short_walk_tokens(q, k_cmp, v_cmp, config)
    # pass 2 apart where the fused launch takes the long walks' tiles tuned on Hopper, not a caller's
    apart = PASS2_APART["enabled"] and select and store_o and not short_walks and not callers_tiles and \
        hopper_tiles_fit(q.dtype, max(DK, DV), q.device)
    if short_walks:
        block_n, blocks_per_step = SHORT_TILES["block_n"], SHORT_TILES["blocks_per_step"]
        num_stages = SHORT_TILES["num_stages"]
        # a launch option of the GPU; the interpreter runs the same tiles without it
        maxnreg = SHORT_TILES["maxnreg"] if q.device.type == "cuda" else None
    block_n = block_n or defaults["BN"]
    num_warps = num_warps or defaults["num_warps"]
    if num_stages is None:
        num_stages = 3 if narrow_16bit else pipeline_stages(2, q.dtype, q.device, max(DK, DV), wide_heads_one_stage=True)
    geo = _score_geometry(config, blocks_per_step)
    o = torch.empty(B, TQ, HQ, DV, dtype=q.dtype, device=q.device) if store_o else None
    lse = torch.empty(B, TQ, HQ, dtype=torch.float32, device=q.device) if store_o else None
    idx = torch.empty(B, TQ, H, config.sel_count, dtype=torch.int32, device=q.device) if select else None
    if B * TQ * HQ == 0:
        return o, lse, idx
    nsel = config.num_sel_blocks(q_offset + TQ) if select else 0
    planes = geo["NSPILL"]
    bt2 = max(1, PASS2_APART["rows"] // GP) if apart and PASS2_APART["rows"] else BT  # pass 2's query tile
    # chunks start on a tile of either pass (both powers of two)
    chunk = query_chunk(B, TQ, H, planes * nsel, max(BT, bt2), score_buffer_bytes) if select else cdiv(TQ, BT) * BT
    # one flat buffer: each chunk views its prefix as a contiguous [B, chunk, H, planes, nsel]
    scores = torch.empty(B * min(chunk, TQ) * H * planes * nsel, dtype=torch.float32, device=q.device) if select else None
    launch = dict(
        H=H, G=G, GP=GP, BT=BT, BN=block_n,
        DK=DK, DV=DV, BDK=next_pow2(DK), BDV=next_pow2(DV),
        L=config.cmp_block, S=config.cmp_stride, SEL=config.sel_block,
        STORE_O=store_o, SELECT=select, PREC=dot_precision(q.dtype, q.device, max(DK, DV)),
        num_warps=num_warps or (4 if BT * GP <= 64 else 8), num_stages=num_stages,
        **geo, **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    chunk_launch, outputs = launch, ((o, lse) if store_o else (q, q))
    if apart:
        # pass 1 once over every query, then pass 2 by chunks in launches of their own
        lse2 = torch.empty(B, TQ, HQ, dtype=torch.float32, device=q.device)
        if gluon_pass1.fits(q, k_cmp, v_cmp):
            gluon_pass1.compressed_pass1_gluon(q, k_cmp, v_cmp, o, lse, lse2, q_offset, scale * LOG2E,
                                               config.cmp_block, config.cmp_stride)
        else:
            pass1 = dict(PASS2_APART["pass1"] or {})
            if "rows" in pass1:
                pass1["BT"] = max(1, pass1.pop("rows") // GP)
            kv_desc = pass1.pop("kv_desc", False) and bulk_copies_supported(q.device)
            pass1 = dict(launch, SELECT=False, **pass1)
            if kv_desc:
                k_cmp, v_cmp = descriptor_ready(k_cmp), descriptor_ready(v_cmp)
                pass1.update(d_k=token_tile_descriptor(k_cmp, pass1["BN"], pass1["BDK"]),
                             d_v=token_tile_descriptor(v_cmp, pass1["BN"], pass1["BDV"]), KV_DESC=True)
            compressed_fwd_kernel[(cdiv(TQ, pass1["BT"]), B * H)](
                q, k_cmp, v_cmp, o, lse, q, TQ, NC, q_offset, scale * LOG2E, 0, TQ, nsel,
                **pass1, lse2=lse2, LSE2_OUT=True, **LAUNCH_OPTIONS,
            )
        chunk_launch = dict(launch, **_score_geometry(config, PASS2_APART["blocks_per_step"]), BT=bt2, STORE_O=False,
                            num_warps=PASS2_APART["num_warps"], num_stages=PASS2_APART["num_stages"],
                            **({"maxnreg": PASS2_APART["maxnreg"]} if PASS2_APART["maxnreg"] else {}),
                            lse2=lse2, PASS1=False)
        outputs = (q, q)  # pass 1 wrote them
    gluon_pass2 = apart and gluon_scores.fits(q, k_cmp, geo["R"])
    for t0 in range(0, TQ, chunk):
        t1 = min(t0 + chunk, TQ)
        sc = scores[: B * (t1 - t0) * H * planes * nsel].view(B, t1 - t0, H, planes, nsel) if select else q
        if gluon_pass2:
            gluon_scores.compressed_scores_gluon(
                q, k_cmp, lse2, sc, q_offset, scale * LOG2E, t0, t1, nsel,
                dict(L=config.cmp_block, S=config.cmp_stride, SEL=config.sel_block, R=geo["R"], KC=geo["KC"],
                     NSPILL=planes))
        else:
            compressed_fwd_kernel[(cdiv(t1 - t0, chunk_launch["BT"]), B * H)](
                q, k_cmp, v_cmp, *outputs, sc,  #
                TQ, NC, q_offset, scale * LOG2E, t0, t1, nsel, **chunk_launch, **LAUNCH_OPTIONS,
            )
        if select:
            block_topn(sc, idx, t0, q_offset + t0, config.sel_block, config.init_blocks, config.local_blocks)
    return o, lse, idx
