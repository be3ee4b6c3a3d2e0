"""Launch 3 of a decode step: the selection programs find the top-n among the score tiles'
candidates and attend over their share of the selected blocks (with descriptors, the forced ones
among them before the wait for the scores); with the window in this launch, its splits too (they
wait for nothing)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nsa.ops._triton.attention import token_tile
from nsa.ops.decode.tiles import (
    attend_range,
    online_softmax_step,
    row_group_program,
    store_partial,
    window_split,
)
from nsa.ops.decode.topn import candidate_keys, take_ranks, top_n_blocks, top_n_threshold


@triton.jit
def _attend_blocks_desc(b_q, d_k, d_v, i_b, i_h, pos, b_j, b_m, b_l, b_acc, qk_scale,  #
                        SEL_BLOCK: tl.constexpr, SB: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                        PREC: tl.constexpr):
    """Online softmax over the selected blocks ``b_j [SB]`` (-1: unused slot, skipped), each one
    bulk copy of ``SEL_BLOCK`` tokens through the descriptors ``d_k``/``d_v``; needs ``pos + 1
    >= SEL_BLOCK``. A block that reaches past ``pos`` (the query's own) is read from
    ``pos + 1 - SEL_BLOCK`` on instead, so that no token past the length is read (a cache
    may hold anything there, NaN included, and 0 * NaN would reach the output); the tokens
    before the block are masked."""
    i_b, i_h, last = i_b.to(tl.int32), i_h.to(tl.int32), pos.to(tl.int32) + 1  # descriptor offsets are 32-bit
    o_sb = tl.arange(0, SB)
    # the used slots moved to the front, in order, and the loop over them alone: an unused slot
    # would still cost a bulk copy
    used = b_j >= 0
    at = tl.cumsum(used.to(tl.int32), 0) - 1
    b_used = tl.max(tl.where(used[None, :] & (at[None, :] == o_sb[:, None]), b_j[None, :], -1), 1)
    for r in range(tl.sum(used.to(tl.int32), 0)):
        j = tl.sum(tl.where(o_sb == r, b_used, 0), 0).to(tl.int32)
        lo = j * SEL_BLOCK
        hi = tl.minimum(lo + SEL_BLOCK, last)
        i0 = tl.minimum(lo, last - SEL_BLOCK)
        b_k = token_tile(d_k, i_b, i0, i_h, SEL_BLOCK, BK)
        b_v = token_tile(d_v, i_b, i0, i_h, SEL_BLOCK, BV)
        o_t = i0 + tl.arange(0, SEL_BLOCK)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BG, SEL_BLOCK]
        b_s = tl.where(((o_t >= lo) & (o_t < hi))[None, :], b_s, float("-inf"))
        b_m, b_l, b_acc = online_softmax_step(b_s, b_v, b_m, b_l, b_acc, PREC)
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
    KEEP: tl.constexpr, RANKED: tl.constexpr, BITONIC: tl.constexpr, LATE_TRIGGER: tl.constexpr,
    INIT: tl.constexpr, LOCAL: tl.constexpr, FORCED_EARLY: tl.constexpr,
):
    """With ``SEL_DESC``, ``d_k``/``d_v`` are tensor descriptors of the cache (block
    ``[1, SEL_BLOCK, 1, D]``) and, once the sequence holds a whole block, every selected
    block is one bulk copy in a loop the compiler pipelines (:func:`_attend_blocks_desc`).

    With ``WIN``, programs ``S_SLC .. S_SLC + S_WIN - 1`` of a row-group are the window's
    splits instead (slots from ``WIN_SLOT0``): they need nothing from the launches before,
    so they do not wait for them, and their reads overlap the selection programs' top-n.

    With ``PDL`` every program lets the next launch start (``gdc_launch_dependents``) as it
    begins, or with ``LATE_TRIGGER`` the selection programs only once their wait for the score
    launch is over: the combine launch then starts after launch 1 has completed (the score
    launch's programs all waited for it), and merges launch 1's partials before its own wait.

    With ``FORCED_EARLY`` (and ``SEL_DESC``) a selection program attends over the forced blocks
    among its ranks (``INIT`` leading blocks, ``LOCAL`` blocks ending at the query's own) before
    its wait: they need no score, and their bytes then move while the score launch runs."""
    TRIGGER_FIRST: tl.constexpr = PDL and not LATE_TRIGGER
    i_s, i_r, i_h, i_b, pos, b_q = row_group_program(q, seq_lens, s_qr, s_qh, TQ, H, G, K, BG, BK, TRIGGER_FIRST)
    i_rh = tl.program_id(1)
    # a window split only where WIN; without it the window path is not compiled at all
    is_window = i_s >= S_SLC if WIN else False
    if is_window:
        if PDL and LATE_TRIGGER:
            gdc_launch_dependents()
        lo, hi = window_split(pos, i_s - S_SLC, S_WIN, WINDOW)
        b_m = tl.full([BG], float("-inf"), tl.float32)
        b_l = tl.zeros([BG], tl.float32)
        b_acc = tl.zeros([BG, BV], tl.float32)
        p_k = k_win + i_b * s_kwb + i_h * s_kwh
        p_v = v_win + i_b * s_vwb + i_h * s_vwh
        b_m, b_l, b_acc = attend_range(b_q, p_k, p_v, s_kwt, s_vwt, lo, hi, b_m, b_l, b_acc, qk_scale, o_part, 0,
                                       G, K, V, BG, BK, BV, WIN_TILE, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
        store_partial(o_part, m_part, l_part, i_r, i_h, WIN_SLOT0 + i_s - S_SLC, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)
    else:
        _selected_program(q, k, v, cand, block_idx, o_part, m_part, l_part, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
                          qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q,
                          H, G, K, V, SEL_BLOCK, N, NP, SB, BJ, BG, BK, BV, BC, TJ, ONE_TILE, PREC, PDL,
                          PER_ROUND, SEL_DESC, SMALL_TILE, d_k, d_v, KEEP, RANKED, BITONIC, LATE_TRIGGER,
                          INIT, LOCAL, FORCED_EARLY)  # fmt: skip


@triton.jit
def _selected_program(
    q, k, v, cand, block_idx, o_part, m_part, l_part, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,  #
    qk_scale, NCAND, SLOT0, S, i_s, i_rh, i_r, i_h, i_b, pos, b_q,  #
    H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,  #
    SEL_BLOCK: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, SB: tl.constexpr, BJ: tl.constexpr,  #
    BG: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,  #
    TJ: tl.constexpr, ONE_TILE: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
    PER_ROUND: tl.constexpr, SEL_DESC: tl.constexpr, SMALL_TILE: tl.constexpr, d_k, d_v, KEEP: tl.constexpr,
    RANKED: tl.constexpr, BITONIC: tl.constexpr, LATE_TRIGGER: tl.constexpr,
    INIT: tl.constexpr, LOCAL: tl.constexpr, FORCED_EARLY: tl.constexpr,
):
    """One selection program: waits for the scores, finds the top-n, attends over its
    share ``[i_s * SB, (i_s + 1) * SB)`` of the selected blocks and writes its partial.
    With ``RANKED`` (one score tile holds all of a row's blocks) the candidates already are
    the top-n, and the rounds are skipped. With ``FORCED_EARLY`` the forced blocks among its
    ranks are attended before the wait (see :func:`decode_selected_fwd_kernel`)."""
    own = pos // SEL_BLOCK
    # -- ranks of the selected blocks in ascending order; this program takes ranks i_s*SB .. --
    o_sb = i_s * SB + tl.arange(0, SB)
    b_m = tl.full([BG], float("-inf"), tl.float32)
    b_l = tl.zeros([BG], tl.float32)
    b_acc = tl.zeros([BG, BV], tl.float32)
    FORCED: tl.constexpr = FORCED_EARLY and SEL_DESC
    if FORCED:
        # Forced keys outrank every scored one (pack_keys), so the init blocks lead the ascending
        # order and the local blocks close it: rank r < INIT is block r, and rank r >= n_sel -
        # LOCAL block own - (n_sel - 1 - r), n_sel = min(own + 1, N) blocks selected in all
        n_sel = tl.minimum(own + 1, N)
        forced = ((o_sb < INIT) | (o_sb >= n_sel - LOCAL)) & (o_sb < n_sel) & (pos + 1 >= SEL_BLOCK)
        b_forced = tl.where(forced, tl.where(o_sb < INIT, o_sb, own - (n_sel - 1 - o_sb)), -1).to(tl.int64)
        b_m, b_l, b_acc = _attend_blocks_desc(b_q, d_k, d_v, i_b, i_h, pos, b_forced, b_m, b_l, b_acc, qk_scale,
                                              SEL_BLOCK, SB, BK, BV, PREC)  # fmt: skip
    if PDL:
        gdc_wait()
        if LATE_TRIGGER:
            gdc_launch_dependents()
    p_idx = block_idx + i_rh.to(tl.int64) * N
    # -- top-n among the candidates of the score tiles that hold visible blocks --
    p_cand = cand + i_rh.to(tl.int64) * NCAND
    n_cand = (own // BJ + 1) * NP
    if BITONIC:
        o_unused, b_key = candidate_keys(p_cand, 0, n_cand, TJ)
        b_j = top_n_blocks(b_key, o_sb, p_idx, i_s, N, NP)
    else:
        b_j = tl.full([SB], -1, tl.int64)
        count = tl.full([], 0, tl.int32)
        if RANKED:
            thr = tl.full([], 0, tl.int64)  # every candidate: the tile's rank kept exactly the top-n
        else:
            thr = top_n_threshold(p_cand, n_cand, own, N, TJ, ONE_TILE, PER_ROUND)
        for c0 in range(0, n_cand, TJ):
            o_j, b_key = candidate_keys(p_cand, c0, n_cand, TJ)
            b_j, count = take_ranks(o_j, b_key, thr, count, o_sb, b_j, p_idx, i_s)
        o_n = tl.arange(0, NP)
        if i_s == 0:
            tl.store(p_idx + o_n, tl.full([NP], -1, tl.int32), mask=(o_n >= count) & (o_n < N))
    # -- attention over this program's blocks, positions <= pos --
    if FORCED:
        b_j = tl.where(forced, -1, b_j)  # attended before the wait
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
            b_m, b_l, b_acc = attend_range(b_q, p_k, p_v, s_kt, s_vt, 0, hi, b_m, b_l, b_acc, qk_scale, o_part, 0,
                                           G, K, V, BG, BK, BV, SMALL_TILE, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
    else:
        p_k = k + i_b * s_kb + i_h * s_kh
        p_v = v + i_b * s_vb + i_h * s_vh
        for r in tl.static_range(SB):
            j = tl.sum(tl.where(tl.arange(0, SB) == r, b_j, 0), 0)
            lo = tl.maximum(j, 0) * SEL_BLOCK
            hi = tl.where(j >= 0, tl.minimum(lo + SEL_BLOCK, pos + 1), lo)
            b_m, b_l, b_acc = attend_range(b_q, p_k, p_v, s_kt, s_vt, lo, hi, b_m, b_l, b_acc, qk_scale, o_part, 0,
                                           G, K, V, BG, BK, BV, BC, 0, PREC, KEEP, 1, 1, 1, 1)  # fmt: skip
    store_partial(o_part, m_part, l_part, i_r, i_h, SLOT0 + i_s, S, b_m, b_l, b_acc, H * G, G, V, BG, BV, KEEP)
