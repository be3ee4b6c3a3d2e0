"""The top-n of a decode step's selection: block keys (score bits over the reversed block index,
so that a tie goes to the lower block, forced blocks on top), the score tiles' candidates,
and the selection programs' ways to the n largest: one bitonic merge of the tiles' sorted runs,
or rounds of maxima; the chosen blocks in ascending order, each program's share of them."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function


# Block keys pack (score bits, reversed index) into one int64: the bits of a
# non-negative float32 order like the floats, and the reversed index makes the
# lower block win a tie. Forced blocks take the bits of +inf.
KEY_SHIFT = tl.constexpr(4294967296)  # 2**32
KEY_INDEX_MAX = tl.constexpr(4294967295)
INF_BITS = tl.constexpr(0x7F800000)
INT64_MAX = tl.constexpr(9223372036854775807)


@triton.jit
def pack_keys(b_sc, o_j, own, INIT: tl.constexpr, LOCAL: tl.constexpr):
    """Keys of blocks ``o_j`` with group scores ``b_sc`` (-1 past the query's own block)."""
    forced = (o_j < INIT) | (o_j > own - LOCAL)
    b_bits = tl.where(forced, INF_BITS, b_sc.to(tl.int32, bitcast=True)).to(tl.int64)
    b_key = b_bits * KEY_SHIFT + (KEY_INDEX_MAX - o_j.to(tl.int64))
    return tl.where(o_j <= own, b_key, -1)


@triton.jit
def _key_block(b_key):
    """The block of each key of :func:`pack_keys` (its low half holds ``KEY_INDEX_MAX - block``)."""
    return (b_key & KEY_INDEX_MAX) ^ KEY_INDEX_MAX


@triton.jit
def candidate_keys(p_cand, c0, n_cand, TJ: tl.constexpr):
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
def top_of_sorted_runs(b_key, RUN: tl.constexpr):
    """The ``RUN`` largest of the keys ``b_key`` (a power of two of them), largest first, where
    consecutive runs of ``RUN`` keys (a power of two) are sorted: largest first in the first half
    of the runs, largest last in the second (the top bit of a run's index, :func:`run_bit`). Each
    level pairs every run with the one half the runs away: the larger of the first one's ``i``-th
    key and the second one's is a bitonic run that holds the pair's largest keys, and
    ``log2(RUN)`` exchange stages sort it by the next bit of its index. Against ``tl.topk`` over
    unsorted keys this skips its first ``log2(RUN) * (log2(RUN) + 1) / 2`` stages over every key:
    at 512 candidates and n = 16, about a third of its compare-exchanges.

    Pairing by the top bit first: 512 keys in 4 warps hold that bit in registers (two 8-byte
    keys a lane, then the layout wraps), so the first level halves every lane's keys without a
    shuffle, and the 4 levels after it exchange 2 keys a lane instead of 4 (the lowest run bit
    first took 4 levels of 4 keys a lane). A batch-16 selection program: 3400 SASS instructions
    for sm_90a against 3592; on an H200, the two in turn three times, us, batch 16 at 64k
    72.0-72.4 against 72.5-72.8, batch 32 123.4-123.9 against 123.9-124.1, batch 16 at 32k (256
    keys, no run bit in registers) and batch 1 the same (session 49)."""
    NP_BITS: tl.constexpr = _log2(RUN)
    RUN_LEVELS: tl.constexpr = _log2(b_key.numel) - NP_BITS
    h = tl.reshape(b_key, [2] * (RUN_LEVELS + NP_BITS))
    for level in tl.static_range(RUN_LEVELS):
        # run i against run i + runs / 2, key by key: the hypercube loses its first axis
        h = tl.max(h, axis=0)
        o_pos = tl.reshape(tl.arange(0, 1 << (RUN_LEVELS + NP_BITS - level - 1)), [2] * (RUN_LEVELS + NP_BITS - level - 1))
        if level < RUN_LEVELS - 1:
            # the next level's pairs (the top bit left): one largest first, one largest last
            up = (o_pos >> (RUN_LEVELS + NP_BITS - level - 2)) & 1
        else:
            up = o_pos * 0  # the last level: largest first
        for stage in tl.static_range(NP_BITS):
            h = _exchange(h, o_pos, NP_BITS - 1 - stage, RUN_LEVELS + NP_BITS - level - 1, up)
    return tl.reshape(h, [1 << NP_BITS])


@constexpr_function
def run_bit(keys: int, run: int) -> int:
    """The bit of a run's index that sets its order for :func:`top_of_sorted_runs` over ``keys``
    keys in runs of ``run``: the top one (0 for a single run, which stays largest first)."""
    return max(_log2(keys) - _log2(run) - 1, 0)


@triton.jit
def top_n_blocks(b_key, o_sb, p_idx, i_s, N: tl.constexpr, NP: tl.constexpr):
    """The blocks of the ``N`` largest keys of ``b_key`` (a 1-D tile in registers, -1 where
    unused; sorted runs of ``NP`` keys, :func:`top_of_sorted_runs`) in ascending order, by one
    bitonic merge of the runs and each block's place among the ``N``. Returns this program's
    blocks ``b_j [SB]`` (ranks ``o_sb``, -1 past the last); program 0 writes the row of
    ``block_idx``, -1 in unused slots. Its compare-exchanges take each key through every stage
    at once, where the rounds of :func:`_top_n_of_keys` reduce across the warps once per round."""
    b_top = top_of_sorted_runs(b_key, NP)
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
def top_n_threshold(p_cand, n_cand, own, N: tl.constexpr, TJ: tl.constexpr, ONE_TILE: tl.constexpr,
                    PER_ROUND: tl.constexpr):
    """The smallest of the ``N`` largest candidate keys (0 when all visible blocks fit).
    With ``ONE_TILE`` every key stays in registers (:func:`_top_n_of_keys`); otherwise each
    round scans the candidates ``TJ`` at a time."""
    thr = tl.full([], 0, tl.int64)
    if own + 1 > N:
        if ONE_TILE:
            o_unused, b_key = candidate_keys(p_cand, 0, n_cand, TJ)
            thr = _top_n_of_keys(b_key, N, PER_ROUND)
        else:
            thr = tl.full([], INT64_MAX, tl.int64)
            for i_round in range(N):
                best = tl.full([], -1, tl.int64)
                for c0 in range(0, n_cand, TJ):
                    o_unused, b_key = candidate_keys(p_cand, c0, n_cand, TJ)
                    best = tl.maximum(best, tl.max(tl.where(b_key < thr, b_key, -1), 0))
                thr = best
    return thr


@triton.jit
def take_ranks(o_j, b_key, thr, count, o_sb, b_j, p_idx, i_s):
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
