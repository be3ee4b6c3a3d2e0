"""Forward of compressed attention, fused with block scoring and top-n selection.

One program owns a tile of ``BT`` query positions and all ``G`` query heads of
one KV head (``M = BT * GP`` rows, heads padded to ``GP``), so every compressed
key tile it loads serves the whole group. Up to two passes over the visible
compressed tokens:

1. online softmax: ``lse`` per row, and ``o`` too when no selection is asked;
2. only with ``SELECT``: recompute ``p = exp2(s - lse)`` (exact probabilities
   over the visible past), add ``p @ v`` into ``o`` when ``STORE_O``, sum ``p``
   over the heads of the group, map compressed tokens onto selection blocks
   (mass-conserving overlap of the spec) and keep a running top-n per query in
   registers. Neither ``[T, Nc]`` nor ``[T, Nsel]`` ever reaches memory.

Pass 2 walks selection blocks in chunks of ``NB``: the chunk covers the
compressed tokens whose first raw position lies in those blocks, laid out as
``[NB, RP]`` (``R = sel_block / cmp_stride`` tokens per block, padded to a power
of two). A token's mass also spills into the following block(s); that spill is
shifted in registers and what falls past the chunk is carried to the next one.

Top-n keeps, per query, the ``NB`` largest int64 keys ``(score bits << 32) |
(2**31 - 1 - block)``: scores are non-negative floats whose bit patterns order
like the values, the low word sends ties to the lower block index, forced
blocks score ``+inf`` and invisible blocks get distinct negative keys. Merging a
chunk moves its best key into the place of each row's worst kept key while that
improves the row (measured faster on H100 than a bitonic ``tl.sort`` merge or
rank counting); the final order comes from counting ranks once per program.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from nsa.config import NSAConfig
from nsa.ops._triton.attention import LOG2E, attn_fwd_finish, attn_fwd_step, dot_precision, next_pow2

_LOW_MASK = 0xFFFFFFFF
_IDX_TOP = 2147483647  # 2**31 - 1: low word of a key is _IDX_TOP - block


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
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [M, BN]
    if MASK:
        b_s = tl.where(m_qk, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1))
    b_shift = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_l = b_l * tl.exp2(b_m - b_shift) + tl.sum(tl.exp2(b_s - b_shift[:, None]), 1)
    return b_m_new, b_l


@triton.jit
def _softmax_chunk(
    b_q, p_k, p_v, i_n, n_hi, nv, b_acc, b_m, b_l, qk_scale,
    BN: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    HDK: tl.constexpr, HDV: tl.constexpr, MASK: tl.constexpr, STORE_O: tl.constexpr, PREC: tl.constexpr,
):
    """Pass-1 step over tokens ``[i_n, i_n + BN)``: online max/sum, and ``o`` when ``STORE_O``.

    p_k/p_v point at token 0 of this (batch, KV head); HDK/HDV are the token strides.
    """
    o_n = i_n + tl.arange(0, BN)
    o_dk = tl.arange(0, BDK)
    m_n = o_n < n_hi
    b_k = tl.load(p_k + (o_n.to(tl.int64) * HDK)[:, None] + o_dk[None, :],
                  mask=m_n[:, None] & (o_dk < DK)[None, :], other=0.0)  # [BN, BDK]
    m_qk = o_n[None, :] < nv[:, None]  # [M, BN]
    if STORE_O:
        o_dv = tl.arange(0, BDV)
        b_v = tl.load(p_v + (o_n.to(tl.int64) * HDV)[:, None] + o_dv[None, :],
                      mask=m_n[:, None] & (o_dv < DV)[None, :], other=0.0)  # [BN, BDV]
        b_acc, b_m, b_l = attn_fwd_step(b_q, b_k, b_v, b_acc, b_m, b_l, m_qk, qk_scale, MASK, PREC)
    else:
        b_m, b_l = _lse_step(b_q, b_k, b_m, b_l, m_qk, qk_scale, MASK, PREC)
    return b_acc, b_m, b_l


@triton.jit
def _block_scores(b_p, b_carry, BT: tl.constexpr, GP: tl.constexpr, NB: tl.constexpr,
                  R: tl.constexpr, RP: tl.constexpr, KC: tl.constexpr, NSPILL: tl.constexpr):
    """Group-summed block scores of one chunk.

    Args:
        b_p: ``[BT * GP, NB * RP]`` probabilities, token ``(jb, r)`` at column ``jb * RP + r``.
        b_carry: ``[BT, NB]`` mass the previous chunk spilled into this one's blocks.
    Returns ``(score [BT, NB], carry for the next chunk [BT, NB])``.
    """
    b_pg = tl.sum(tl.reshape(b_p, [BT, GP, NB * RP]), 1)  # [BT, NB*RP]: Eq. 10 group sum
    b_p3 = tl.reshape(b_pg, [BT, NB, RP])
    o_r = tl.arange(0, RP)
    o_src = tl.arange(0, NB)
    b_score = b_carry
    b_next = tl.zeros([BT, NB], dtype=tl.float32)
    for s in tl.static_range(NSPILL):
        # units [r, r + KC) of a token at offset r against block offset s: [s*R, s*R + R)
        w = tl.minimum(o_r + KC, s * R + R) - tl.maximum(o_r, s * R)
        w = tl.where((o_r < R) & (w > 0), w, 0).to(tl.float32) / KC  # [RP]
        b_a = tl.sum(b_p3 * w[None, None, :], 2)  # [BT, NB]: mass of block jb's tokens in block jb + s
        if s == 0:
            b_score += b_a
        else:
            m_here = (o_src[:, None] + s) == o_src[None, :]  # [NB(src), NB(dst)]
            m_next = (o_src[:, None] + s) == (o_src[None, :] + NB)
            b_score += tl.sum(tl.where(m_here[None, :, :], b_a[:, :, None], 0.0), 1)
            b_next += tl.sum(tl.where(m_next[None, :, :], b_a[:, :, None], 0.0), 1)
    return b_score, b_next


@triton.jit
def _rank_place(b_a, b_b, DESC: tl.constexpr, NB: tl.constexpr):
    """Rank the ``2 * NB`` distinct int64 keys of ``b_a``/``b_b`` (``[BT, NB]`` each) and
    return the first ``NB`` in rank order (descending or ascending): ``[BT, NB]``.

    Ranks by counting (``[BT, NB, NB]`` compares) instead of a sorting network: no
    data-dependent control flow, and few enough ops for the interpreter.
    """
    if DESC:
        r_a = tl.sum((b_a[:, None, :] > b_a[:, :, None]).to(tl.int32), 2) + \
            tl.sum((b_b[:, None, :] > b_a[:, :, None]).to(tl.int32), 2)
        r_b = tl.sum((b_a[:, None, :] > b_b[:, :, None]).to(tl.int32), 2) + \
            tl.sum((b_b[:, None, :] > b_b[:, :, None]).to(tl.int32), 2)
    else:
        r_a = tl.sum((b_a[:, None, :] < b_a[:, :, None]).to(tl.int32), 2) + \
            tl.sum((b_b[:, None, :] < b_a[:, :, None]).to(tl.int32), 2)
        r_b = tl.sum((b_a[:, None, :] < b_b[:, :, None]).to(tl.int32), 2) + \
            tl.sum((b_b[:, None, :] < b_b[:, :, None]).to(tl.int32), 2)
    o_s = tl.arange(0, NB)
    # every rank occurs once, so each slot sums exactly one key
    b_out = tl.sum(tl.where(r_a[:, :, None] == o_s[None, None, :], b_a[:, :, None], 0), 1)
    b_out += tl.sum(tl.where(r_b[:, :, None] == o_s[None, None, :], b_b[:, :, None], 0), 1)
    return b_out


@triton.jit
def _merge_topn(b_buf, b_score, o_blk, own, INIT: tl.constexpr, LOCAL: tl.constexpr):
    """Merge one chunk's scores ``[BT, NB]`` for blocks ``o_blk [NB]`` into the kept keys
    ``b_buf [BT, NB]`` (int64, distinct, in no order); ``own [BT]`` is each query's own block."""
    m_vis = o_blk[None, :] <= own[:, None]
    m_forced = m_vis & ((o_blk[None, :] < INIT) | (o_blk[None, :] > own[:, None] - LOCAL))
    b_score = tl.where(m_forced, float("inf"), b_score)
    # scores are >= 0; clearing the sign bit also maps a stray -0.0 onto +0.0
    b_bits = (b_score.to(tl.int32, bitcast=True) & 0x7FFFFFFF).to(tl.int64)
    b_key = (b_bits << 32) | (2147483647 - o_blk[None, :]).to(tl.int64)
    # invisible blocks: negative and distinct, below every visible key
    b_key = tl.where(m_vis, b_key, -2 - o_blk[None, :].to(tl.int64))
    # insert the chunk's best key per row while it beats that row's worst kept key: keys
    # are distinct, so each pass moves exactly one key per inserting row, and the loop
    # ends once no row improves (at most NB + 1 passes; few once the kept keys are good)
    b_min = tl.min(b_buf, 1)
    b_top = tl.max(b_key, 1)
    while tl.max((b_top > b_min).to(tl.int32), 0) > 0:
        m_ins = b_top > b_min
        b_buf = tl.where(m_ins[:, None] & (b_buf == b_min[:, None]), b_top[:, None], b_buf)
        b_key = tl.where(b_key == b_top[:, None], -9223372036854775807, b_key)
        b_min = tl.min(b_buf, 1)
        b_top = tl.max(b_key, 1)
    return b_buf


@triton.jit
def _store_topn(b_buf, p_idx, m_t, N: tl.constexpr, NB: tl.constexpr):
    """Write the best ``N`` keys of ``b_buf [BT, NB]`` (best first) as block indices
    ascending, padded with -1."""
    o_c = tl.arange(0, NB).to(tl.int64)
    BIG: tl.constexpr = 1 << 40
    b_blk = 2147483647 - (b_buf & 0xFFFFFFFF)
    m_top = (b_buf >= 0) & (o_c[None, :] < N)
    # distinct fillers keep the ranks a permutation; they sort after every block
    b_val = tl.where(m_top, b_blk, BIG + o_c[None, :])
    b_val = _rank_place(b_val, tl.full(b_val.shape, BIG + NB, tl.int64) + o_c[None, :], False, NB)
    b_val = tl.where(b_val >= BIG, -1, b_val).to(tl.int32)
    tl.store(p_idx[:, None] + o_c[None, :], b_val, mask=m_t[:, None] & (o_c[None, :] < N))


@triton.jit
def _select_pass(
    b_q, p_k, p_v, nv, n_hi, b_lse, m_row, own, t_last, b_acc, qk_scale,
    BT: tl.constexpr, GP: tl.constexpr, NB: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    KC: tl.constexpr, NSPILL: tl.constexpr, SEL: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,
    BDK: tl.constexpr, BDV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    HDK: tl.constexpr, HDV: tl.constexpr, STORE_O: tl.constexpr, PREC: tl.constexpr,
):
    """Pass 2: exact probabilities, ``o += p @ v`` when ``STORE_O``, block scores, top-n.

    Args:
        nv: ``[M]`` visible tokens per row; n_hi: the most any row sees; b_lse: ``[M]``
            log2-domain lse; m_row: ``[M]`` real rows; own: ``[BT]`` each query's block.
    Returns ``(acc [M, BDV], keys [BT, NB])``.
    """
    BC: tl.constexpr = NB * RP
    o_c = tl.arange(0, BC)
    o_dk = tl.arange(0, BDK)
    o_dv = tl.arange(0, BDV)
    o_nb = tl.arange(0, NB)
    # initial keys: distinct and below every real key
    b_buf = -(1 << 40) - tl.arange(0, NB)[None, :].to(tl.int64) + tl.zeros([BT, NB], dtype=tl.int64)
    b_carry = tl.zeros([BT, NB], dtype=tl.float32)
    for i_j in range(0, t_last // SEL + 1, NB):
        # -- tokens whose first raw position lies in blocks [i_j, i_j + NB), as [NB, RP] --
        o_tok = (i_j + o_c // RP) * R + o_c % RP  # [BC]
        m_tok = (o_c % RP < R) & (o_tok < n_hi)
        b_k = tl.load(p_k + (o_tok.to(tl.int64) * HDK)[:, None] + o_dk[None, :],
                      mask=m_tok[:, None] & (o_dk < DK)[None, :], other=0.0)  # [BC, BDK]
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [M, BC]
        m_qk = m_row[:, None] & m_tok[None, :] & (o_tok[None, :] < nv[:, None])
        # mask the scores, not the probabilities: an invisible score may exceed lse
        b_p = tl.exp2(tl.where(m_qk, b_s, float("-inf")) - b_lse[:, None])  # [M, BC]
        if STORE_O:
            b_v = tl.load(p_v + (o_tok.to(tl.int64) * HDV)[:, None] + o_dv[None, :],
                          mask=m_tok[:, None] & (o_dv < DV)[None, :], other=0.0)  # [BC, BDV]
            b_acc += tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC)
        b_score, b_carry = _block_scores(b_p, b_carry, BT, GP, NB, R, RP, KC, NSPILL)
        b_buf = _merge_topn(b_buf, b_score, i_j + o_nb, own, INIT, LOCAL)
    # best first: rank against distinct keys below everything
    b_low = -(1 << 62) - tl.arange(0, NB)[None, :].to(tl.int64) + tl.zeros([BT, NB], dtype=tl.int64)
    b_buf = _rank_place(b_buf, b_low, True, NB)
    return b_acc, b_buf


@triton.jit(do_not_specialize=["TQ", "NC", "q_offset"])
def compressed_fwd_kernel(
    q,  # [B, TQ, HQ, DK]
    k,  # [B, NC, H, DK]
    v,  # [B, NC, H, DV]
    o,  # [B, TQ, HQ, DV]
    lse,  # [B, TQ, HQ] float32, natural log
    block_idx,  # [B, TQ, H, N] int32
    TQ, NC, q_offset, qk_scale,
    H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BDK: tl.constexpr, BDV: tl.constexpr,
    L: tl.constexpr, S: tl.constexpr, SEL: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
    KC: tl.constexpr, NSPILL: tl.constexpr, NB: tl.constexpr, N: tl.constexpr,
    INIT: tl.constexpr, LOCAL: tl.constexpr,
    STORE_O: tl.constexpr, SELECT: tl.constexpr, PREC: tl.constexpr,
):
    M: tl.constexpr = BT * GP
    # the last query tiles see the most tokens: launch them first
    i_t = tl.cdiv(TQ, BT) - 1 - tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_tq, m_row, o_q = group_rows(i_b, i_t, i_h, TQ, H, G, GP, BT)
    o_dk = tl.arange(0, BDK)
    b_q = tl.load(q + (o_q * DK)[:, None] + o_dk[None, :], mask=m_row[:, None] & (o_dk < DK)[None, :], other=0.0)
    nv = visible_cmp(q_offset + o_tq, NC, L, S)  # [M]
    t_last = q_offset + tl.minimum(i_t * BT + BT, TQ) - 1
    n_lo = visible_cmp(q_offset + i_t * BT, NC, L, S)
    n_hi = visible_cmp(t_last, NC, L, S)
    p_k = k + (i_b.to(tl.int64) * NC * H + i_h) * DK
    p_v = v + (i_b.to(tl.int64) * NC * H + i_h) * DV
    # -- pass 1: online softmax; it carries o only when no second pass follows --
    ONE_PASS_O: tl.constexpr = STORE_O and not SELECT
    b_m = tl.full([M], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([M], dtype=tl.float32)
    b_acc = tl.zeros([M, BDV], dtype=tl.float32)
    n_full = (n_lo // BN) * BN
    for i_n in range(0, n_full, BN):
        b_acc, b_m, b_l = _softmax_chunk(b_q, p_k, p_v, i_n, n_hi, nv, b_acc, b_m, b_l, qk_scale,
                                         BN, BDK, BDV, DK, DV, H * DK, H * DV, False, ONE_PASS_O, PREC)
    for i_n in range(n_full, n_hi, BN):
        b_acc, b_m, b_l = _softmax_chunk(b_q, p_k, p_v, i_n, n_hi, nv, b_acc, b_m, b_l, qk_scale,
                                         BN, BDK, BDV, DK, DV, H * DK, H * DV, True, ONE_PASS_O, PREC)
    b_o, b_lse = attn_fwd_finish(b_acc, b_m, b_l)
    # -- pass 2: exact probabilities -> o, block scores, top-n --
    if SELECT:
        o_t = i_t * BT + tl.arange(0, BT)
        own = (q_offset + o_t) // SEL
        # a row with lse = -inf sees nothing and is masked everywhere: shift it by 0, not -inf
        b_lse_safe = tl.where(b_lse == float("-inf"), 0.0, b_lse)
        b_o, b_buf = _select_pass(b_q, p_k, p_v, nv, n_hi, b_lse_safe, m_row, own, t_last, b_acc, qk_scale,
                                  BT, GP, NB, R, RP, KC, NSPILL, SEL, INIT, LOCAL,
                                  BDK, BDV, DK, DV, H * DK, H * DV, STORE_O, PREC)
        p_idx = block_idx + ((i_b.to(tl.int64) * TQ + o_t) * H + i_h) * N
        _store_topn(b_buf, p_idx, o_t < TQ, N, NB)
    if STORE_O:
        o_dv = tl.arange(0, BDV)
        tl.store(o + (o_q * DV)[:, None] + o_dv[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_row[:, None] & (o_dv < DV)[None, :])
        tl.store(lse + o_q, b_lse * 0.6931471805599453, mask=m_row)


def _select_geometry(config: NSAConfig) -> dict:
    """Constexprs of pass 2: tokens per block ``R`` (padded ``RP``), tokens per compressed
    block ``KC``, spill steps, and the chunk/keep width ``NB``."""
    R = config.sel_block // config.cmp_stride
    KC = config.cmp_block // config.cmp_stride
    RP = triton.next_power_of_2(R)
    NSPILL = (R + KC - 2) // R + 1  # block offsets a token's units can reach
    # NB >= n keeps enough keys; NB * RP >= 16 for tl.dot; NB >= NSPILL - 1 keeps spill within one chunk
    NB = max(triton.next_power_of_2(config.sel_count), triton.cdiv(16, RP), triton.next_power_of_2(NSPILL))
    return dict(R=R, RP=RP, KC=KC, NSPILL=NSPILL, NB=NB)


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
    block_n: int = 64,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Launch the fused forward on contiguous inputs.

    Args:
        q: ``[B, Tq, HQ, Dk]``; k_cmp: ``[B, Nc, H, Dk]``; v_cmp: ``[B, Nc, H, Dv]``.
        store_o: compute ``o`` and ``lse``; select: compute ``block_idx``.
        rows: query rows ``M = BT * GP`` per program (default 64); block_n: pass-1
            token tile; num_warps/num_stages: launch options (defaults from the shapes).

    Returns:
        ``(o [B, Tq, HQ, Dv] in q's dtype, lse [B, Tq, HQ] float32, block_idx
        [B, Tq, H, sel_count] int32)``, each ``None`` when not asked for.
    """
    B, TQ, HQ, DK = q.shape
    NC, H, DV = k_cmp.shape[1], k_cmp.shape[2], v_cmp.shape[3]
    G = HQ // H
    GP = triton.next_power_of_2(G)
    # 64 rows, 4 warps measured fastest on H100/H200 at 8k-64k tokens (docs/perf/compressed_select.md);
    # a third pipeline stage fits shared memory for 16-bit heads up to 128 wide
    rows = rows or 64
    if num_stages is None:
        num_stages = 3 if (max(DK, DV) <= 128 and q.dtype != torch.float32) else 2
    BT = max(1, rows // GP)
    geo = _select_geometry(config)
    o = torch.empty(B, TQ, HQ, DV, dtype=q.dtype, device=q.device) if store_o else None
    lse = torch.empty(B, TQ, HQ, dtype=torch.float32, device=q.device) if store_o else None
    idx = torch.empty(B, TQ, H, config.sel_count, dtype=torch.int32, device=q.device) if select else None
    if B * TQ * HQ == 0:
        return o, lse, idx
    grid = (triton.cdiv(TQ, BT), B * H)
    compressed_fwd_kernel[grid](
        q, k_cmp, v_cmp,  #
        o if store_o else q, lse if store_o else q, idx if select else q,  #
        TQ, NC, q_offset, scale * LOG2E,
        H=H, G=G, GP=GP, BT=BT, BN=block_n,
        DK=DK, DV=DV, BDK=next_pow2(DK), BDV=next_pow2(DV),
        L=config.cmp_block, S=config.cmp_stride, SEL=config.sel_block,
        N=config.sel_count, INIT=config.init_blocks, LOCAL=config.local_blocks,
        STORE_O=store_o, SELECT=select, PREC=dot_precision(q.dtype),
        num_warps=num_warps or (4 if BT * GP <= 64 else 8), num_stages=num_stages,
        **geo,
    )
    return o, lse, idx
