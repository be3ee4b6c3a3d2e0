"""Device helpers of the selected-attention kernels: a program's query tile and its selected blocks, the
entries of a block's (query, block) segment, the rows of a key or value block, and the forced blocks."""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.ops._triton.attention import token_tile


@triton.jit
def _selection(p_idx, t0, n_q, stride_q, N: tl.constexpr, NP: tl.constexpr, BQ: tl.constexpr, BS: tl.constexpr,
               INIT: tl.constexpr, LOCAL: tl.constexpr):
    """The blocks that the ``n_q <= BQ`` queries at positions ``t0, t0 + 1, ..`` (lists of
    ``N`` entries, ``stride_q`` apart from ``p_idx``) attend to, each block once: ``[BQ * NP]``
    int32, with -1 in place of every entry that does not count (negative, past its query's
    position, a repeat in its query's list, the forced blocks of its query (the ``INIT`` first
    and the ``LOCAL`` last), which the forced-block kernels handle for a whole tile of queries)
    and of every later entry of a block that an earlier query of the tile already holds.

    Returns ``(b_rank, b_blk, b_who, count)``: the entries that count are ranked ``0 .. count - 1``
    (the rest -1), so the entry loop runs ``count`` times and skips the others instead
    of running masked steps for them (with the paper's 3 forced blocks of 16, the forward
    took 2.01 against 2.19 ms and the dQ 2.12 against 2.51 at 8k on an H100); ``b_who`` has
    bit ``j`` set where query ``j`` of the tile counts the entry's block."""
    E: tl.constexpr = BQ * NP
    o_e = tl.arange(0, E)
    o_j, o_n = o_e // NP, o_e % NP  # query of the tile, entry of its list
    t = t0 + o_j
    b_idx = tl.load(p_idx + o_j.to(tl.int64) * stride_q + o_n, mask=(o_n < N) & (o_j < n_q), other=-1).to(tl.int32)
    same = b_idx[:, None] == b_idx[None, :]  # [E, E]
    earlier = o_e[None, :] < o_e[:, None]
    b_rep = tl.max((same & earlier & (o_j[:, None] == o_j[None, :])).to(tl.int32), 1)  # [E]
    b_ok = (b_idx >= 0) & (b_idx.to(tl.int64) * BS <= t) & (b_rep == 0)
    if INIT + LOCAL > 0:
        j_t = t // BS
        b_ok = b_ok & (b_idx >= INIT) & ((b_idx <= j_t - LOCAL) | (b_idx > j_t))
    if BQ > 1:
        # each query holds a block once, so the sum of its choosers' bits is their union
        b_who = tl.sum(tl.where(same & b_ok[None, :], 1 << o_j[None, :], 0), 1)
        b_ok = b_ok & (tl.max((same & earlier & b_ok[None, :]).to(tl.int32), 1) == 0)
    else:
        b_who = b_ok.to(tl.int32)
    b_rank = tl.where(b_ok, tl.cumsum(b_ok.to(tl.int32), 0) - 1, -1)
    return b_rank, tl.where(b_ok, b_idx, -1), b_who, tl.sum(b_ok.to(tl.int32), 0)


@triton.jit
def step_entry(i, KEY_TILES: tl.constexpr):
    """The rank of the entry (or forced block) that step ``i`` of a loop reads a tile of: a loop
    reads each block in ``KEY_TILES`` tiles of ``BSP // KEY_TILES`` keys (1: the whole block at
    once). More tiles hold less of a block in shared memory at a time, for launches that do not
    fit it otherwise (exact float32 with 128-key blocks and wide heads)."""
    if KEY_TILES == 1:
        e = i
    else:
        e = i // KEY_TILES
    return e


@triton.jit
def step_keys(i, BSP: tl.constexpr, KEY_TILES: tl.constexpr):
    """The keys within its block that step ``i`` reads (:func:`step_entry`): ``[BSP // KEY_TILES]``."""
    if KEY_TILES == 1:
        o_c = tl.arange(0, BSP)
    else:
        o_c = (i % KEY_TILES) * (BSP // KEY_TILES) + tl.arange(0, BSP // KEY_TILES)
    return o_c


@triton.jit
def entry_keys(b_rank, b_blk, e, o_c, t_last, BS: tl.constexpr, LOCAL: tl.constexpr):
    """The block of the entry of rank ``e`` in ``b_blk``, the positions ``o_s`` of its keys
    ``o_c`` (:func:`step_keys`) and which of them to read: with ``LOCAL > 0`` each query's own
    block is forced, so every entry lies wholly before its queries and only the padding past
    ``BS`` is masked; else also the keys past ``t_last``."""
    blk = tl.sum(tl.where(b_rank == e, b_blk, 0), 0)
    o_s = blk.to(tl.int64) * BS + o_c
    if LOCAL > 0:
        m_s = o_c < BS
    else:
        m_s = (o_c < BS) & (o_s <= t_last)
    return blk, o_s, m_s


@triton.jit
def block_rows(p, stride_t, d, blk, o_s, m_s, o_d, m_d, i_b, i_h, BS: tl.constexpr, BSP: tl.constexpr,
               LOCAL: tl.constexpr, DESC: tl.constexpr):
    """``[BSP, BD]`` rows ``o_s`` of K or V (``p`` at the batch and head, or the descriptor ``d``
    with ``DESC``: one bulk copy of the whole block), zero where ``m_s`` is false."""
    if DESC:
        tl.static_assert(o_s.shape[0] == BSP, "bulk copies read whole blocks: one key tile a block")
        b_x = token_tile(d, i_b, blk * BS, i_h, BSP, o_d.shape[0])
        if (LOCAL == 0) or (BS != BSP):
            # masked keys leave the scores, but unwritten cache entries (NaN) would reach P V and dS K
            b_x = tl.where(m_s[:, None], b_x, 0.0)
    else:
        b_x = tl.load(p + o_s[:, None] * stride_t + o_d[None, :], mask=m_s[:, None] & m_d[None, :], other=0.0)
    return b_x


@triton.jit
def entry_kv(p_k, p_v, skt, svt, b_rank, b_blk, b_who, i, t_last, o_pos, o_rq, o_dk, o_dv, m_dk, m_dv,
             BS: tl.constexpr, BSP: tl.constexpr, LOCAL: tl.constexpr, BQ: tl.constexpr,
             d_k, d_v, i_b, i_h, DESC: tl.constexpr, KEY_TILES: tl.constexpr = 1):
    """K ``[BKT, BK]``, V ``[BKT, BV]`` of step ``i`` (:func:`step_entry`: ``BKT = BSP //
    KEY_TILES`` keys of the block of an entry of ``b_blk``) and their visibility: ``[1, BKT]``
    (the keys :func:`entry_keys` reads) for one query, ``[BQ * GP, BKT]`` for a tile (rows
    ``o_rq`` of the queries that count the block, ``s <= o_pos``). With ``DESC`` the block
    comes by one bulk copy through the tensor descriptors ``d_k``/``d_v`` (blocks ``[1, BSP,
    1, BK|BV]``) instead of ``p_k``/``p_v``."""
    o_c = step_keys(i, BSP, KEY_TILES)
    e = step_entry(i, KEY_TILES)
    blk, o_s, m_s = entry_keys(b_rank, b_blk, e, o_c, t_last, BS, LOCAL)
    b_k = block_rows(p_k, skt, d_k, blk, o_s, m_s, o_dk, m_dk, i_b, i_h, BS, BSP, LOCAL, DESC)
    b_v = block_rows(p_v, svt, d_v, blk, o_s, m_s, o_dv, m_dv, i_b, i_h, BS, BSP, LOCAL, DESC)
    if BQ > 1:
        who = tl.sum(tl.where(b_rank == e, b_who, 0), 0)
        m_qk = (((who >> o_rq) & 1) != 0)[:, None] & m_s[None, :]
        if LOCAL == 0:
            m_qk = m_qk & (o_s[None, :] <= o_pos[:, None])
    else:
        m_qk = m_s[None, :]
    return b_k, b_v, m_qk


@triton.jit
def query_tile(i_t, i_h, T, q_offset, G: tl.constexpr, GP: tl.constexpr, BQ: tl.constexpr):
    """Rows of tile ``i_t``, ``BQ`` query positions x ``GP`` heads: query index, query head,
    real rows, position, and query within the tile."""
    o_r = tl.arange(0, BQ * GP)
    o_rq = o_r // GP
    o_i = i_t * BQ + o_rq
    return o_i, i_h * G + o_r % GP, (o_r % GP < G) & (o_i < T), q_offset + o_i, o_rq


@triton.jit
def tile_selection(block_idx, i_b, i_h, i_t, T, q_offset, H: tl.constexpr, N: tl.constexpr, NP: tl.constexpr,
                   BQ: tl.constexpr, BS: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr):
    """:func:`_selection` of the queries of tile ``i_t`` in KV head ``i_h``."""
    i0 = i_t * BQ
    p_idx = block_idx + ((i_b.to(tl.int64) * T + i0) * H + i_h) * N
    return _selection(p_idx, q_offset + i0, T - i0, H * N, N, NP, BQ, BS, INIT, LOCAL)


@triton.jit
def forced_kv(
    p_k, p_v, skt, svt, b_list, i, l_lo, o_j, o_pos, m_r, o_dk, o_dv, m_dk, m_dv,  #
    BS: tl.constexpr, BSP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr, KEY_TILES: tl.constexpr = 1,
):
    """K ``[BKT, BK]``, V ``[BKT, BV]`` of step ``i`` (:func:`step_entry`: ``BKT = BSP //
    KEY_TILES`` keys of the tile's forced block of rank ``i // KEY_TILES``, ``i_f``: the initial
    ones, then the local ones from ``l_lo``, :func:`forced_range`) and its ``[BM, BKT]``
    visibility for rows whose selection lists are ``b_list [BM, NP]``.

    A row counts the block only if its list holds it and it is forced for the row's
    own block ``o_j`` (always for an initial block, ``i_f < INIT``; for the ``LOCAL``
    last ones else)."""
    e = step_entry(i, KEY_TILES)
    i_f = tl.where(e < INIT, e, l_lo + e - INIT)
    m_rows = (tl.max((b_list == i_f).to(tl.int32), 1) > 0) & m_r  # [BM]
    m_rows = m_rows & ((i_f < INIT) | ((o_j - LOCAL < i_f) & (i_f <= o_j)))
    o_c = step_keys(i, BSP, KEY_TILES)
    o_s = o_c.to(tl.int64) + i_f * BS  # i_f * BS is a position: int32 is enough
    t_use = tl.max(tl.where(m_rows, o_pos, -1), 0)  # last position that needs the block, -1 if none
    m_s = (o_c < BS) & (o_s <= t_use)
    b_k = tl.load(p_k + o_s[:, None] * skt + o_dk[None, :], mask=m_s[:, None] & m_dk[None, :], other=0.0)
    b_v = tl.load(p_v + o_s[:, None] * svt + o_dv[None, :], mask=m_s[:, None] & m_dv[None, :], other=0.0)
    m_qk = m_rows[:, None] & (o_s[None, :] <= o_pos[:, None]) & m_s[None, :]
    return b_k, b_v, m_qk


@triton.jit
def forced_range(j_lo, j_hi, INIT: tl.constexpr, LOCAL: tl.constexpr):
    """The forced blocks of a tile whose queries' own blocks are ``j_lo .. j_hi``: the ``INIT``
    initial ones, then the local ones from ``l_lo`` that are not initial. Returns ``(l_lo,
    count)``; one loop walks them all, so that the pipeline fetches each block while the one
    before is in use (two loops, initial then local: H100 8k forward 0.275 against 0.259 ms,
    dQ 0.308 against 0.295; 64k 2.07 against 1.99 and 2.32 against 2.26)."""
    l_lo = tl.maximum(j_lo - LOCAL + 1, INIT)
    return l_lo, INIT + tl.maximum(j_hi + 1 - l_lo, 0)


@triton.jit
def forced_tile(block_idx, i_b, i_h, i_t, T, q_offset, H: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                BT: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, BS: tl.constexpr):
    """Rows of a forced-block tile (``BT`` positions x ``GP`` heads, :func:`query_tile`):
    query index, query head, validity, position, own block, and the rows' lists ``[BM, NP]``."""
    o_i, o_hq, m_r, o_pos, _ = query_tile(i_t, i_h, T, q_offset, G, GP, BT)
    o_n = tl.arange(0, NP)
    p_list = block_idx + ((i_b.to(tl.int64) * T + o_i) * H + i_h)[:, None] * N + o_n[None, :]
    b_list = tl.load(p_list, mask=m_r[:, None] & (o_n < N)[None, :], other=-1)  # [BM, NP]
    return o_i, o_hq, m_r, o_pos, o_pos // BS, b_list


@triton.jit
def store_rows(p, b_x, o_c, o_d, m_c, m_d, D: tl.constexpr):
    """Store a ``[BSP, BD]`` tile into rows ``o_c`` of a ``[.., D]``-strided slice."""
    tl.store(p + o_c.to(tl.int64)[:, None] * D + o_d[None, :], b_x, mask=m_c[:, None] & m_d[None, :])
