"""Top-n block selection (spec Eq. 11) from a buffer of group block scores.

One program takes ``BR`` rows (one per query and KV group) and keeps each whole
row in registers. A row holds ``planes`` float32 planes of ``nsel`` block masses:
plane ``s`` at block ``j`` is the mass that block ``j - s``'s tokens put into block
``j`` (compressed tokens that straddle a block boundary; plane ``s`` below block ``s``
is never read), so a block's score is the sum of the planes at ``j``. Per row:

1. keys: the score's bit pattern (non-negative floats order like their bits),
   ``+inf`` bits for forced blocks, ``-1`` for blocks past the query's own;
2. radix select: one round per bit from the top finds the largest key ``thr``
   that at least ``n`` keys reach - the n-th largest key. Two bounds cheap to
   reduce hold it (the least of ``n`` strided groups' maxima, the largest key
   not forced), and the bits above the first where they differ are theirs: only
   the rounds below run (of 31);
3. chosen = keys above ``thr`` plus, among keys equal to ``thr``, the lowest
   block indices that fill ``n`` (the spec's tie rule, exact);
4. a prefix sum over the chosen mask gives each block its place, so the row is
   written ascending with one scatter, then padded with ``-1``.

The work per row is at most ``31 * nsel`` compares whatever the scores look like,
and rows run in parallel.

A row's planes are read in whole 16-block pieces up to the query's own block (the
masses past it, which may hold anything, are then dropped as keys): where ``nsel``
is a multiple of 16, Triton proves the masks constant over 4 blocks and each thread
reads its blocks by 16-byte loads, all issued before the first is used. Masked block
by block, ptxas issued a row's 32 scalar loads two at a time, each pair waited for
before the next (Nsight Compute, H200, rows of 1024 blocks: 41 % of the kernel's
stall samples on reading the rows; docs/perf/prefill.md, session 75).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2

INF_BITS = tl.constexpr(0x7F800000)
#: Blocks a row may hold and stay inside one warp (32 keys a thread), so that the counting rounds
#: reduce with shuffles alone (no shared memory, no barriers); wider rows spread over warps at 16 keys
#: a thread. H200, the 64k forward's chunks of rows of 1024 blocks with the whole-piece reads, ms for 1
#: / 2 / 4 warps: 0.248 / 0.270-0.271 / 0.329-0.331 (rows of 512: 0.135 / 0.165-0.166 / 0.219-0.220;
#: session 75); H100, of 2048 blocks (128k tokens) 0.514-0.615 / 0.422-0.433 / 0.377-0.393 (sessions
#: 13-14, docs/perf/prefill.md).
ONE_WARP_BLOCKS = 1024
#: ``bounds``: run only the radix rounds below the first bit where the answer's two bounds differ
#: (else all 31, unrolled; the same blocks either way). H200, the 8 launches of a 64k forward in
#: place: 1.60-1.63 ms against 1.89-1.93; the forward 33.98-34.38 against 34.63-34.77 (ABBA rounds,
#: L2 flushed); 8k unchanged at 0.046 (docs/perf/prefill.md, session 55).
LAUNCH = dict(bounds=True)


# NSEL stays specialised: its divisibility by 16 lets the row's loads go 16 bytes at a time
@triton.jit(do_not_specialize=["ROWS", "TC", "TQ", "T0", "t_first"])
def block_topn_kernel(
    scores,  # [B, TC, H, PLANES, NSEL] float32 block masses of queries T0 .. T0 + TC - 1
    block_idx,  # [B, TQ, H, N] int32
    ROWS, NSEL, TC, TQ, T0, t_first,  # t_first: absolute position of query T0
    H: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, SEL: tl.constexpr,
    INIT: tl.constexpr, LOCAL: tl.constexpr, BR: tl.constexpr, NSP: tl.constexpr, PLANES: tl.constexpr,
    NG: tl.constexpr, BOUNDS: tl.constexpr = True,
):
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)  # [BR] score rows
    m_r = o_r < ROWS
    i_t = (o_r // H) % TC  # query within the chunk
    i_b = o_r // (H * TC)
    own = (t_first + i_t) // SEL  # [BR] each query's own block
    o_j = tl.arange(0, NSP)
    m_vis = (o_j[None, :] <= own[:, None]) & m_r[:, None]  # [BR, NSP]
    p_row = scores + o_r[:, None] * (PLANES * NSEL)
    # whole 16-block pieces up to the own block: a mask constant over 4 blocks (see the docstring)
    m_read = (o_j[None, :] < (own[:, None] // 16 + 1) * 16) & (o_j[None, :] < NSEL) & m_r[:, None]
    b_s = tl.load(p_row + o_j[None, :], mask=m_read, other=0.0)
    for shift in tl.static_range(1, PLANES):
        b_spill = tl.load(p_row + shift * NSEL + o_j[None, :], mask=m_read, other=0.0)
        b_s += tl.where(o_j[None, :] >= shift, b_spill, 0.0)  # below block `shift` nothing was written
    # scores are >= 0; clearing the sign bit maps a stray -0.0 onto +0.0
    b_key = b_s.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    forced = (o_j[None, :] < INIT) | (o_j[None, :] > own[:, None] - LOCAL)
    b_key = tl.where(forced, INF_BITS, b_key)
    b_key = tl.where(m_vis, b_key, -1)
    # -- radix select: the largest thr with count(key >= thr) >= N (0 if fewer are visible) --
    # It lies in [lo, hi], so the bits above the highest one where lo and hi differ are theirs and
    # only the rounds below it are run. lo: NG >= N keys reach the least of NG strided groups'
    # maxima. hi: the largest key that is not forced, unless N are forced (then +inf's bits).
    if BOUNDS:
        b_free = tl.where(b_key == INF_BITS, -1, b_key)
        hi = tl.max(b_free, 1)
        hi = tl.where(tl.sum((b_key == INF_BITS).to(tl.int32), 1) >= N, INF_BITS, tl.maximum(hi, 0))
        if NG >= N:
            lo = tl.maximum(tl.min(tl.max(tl.reshape(b_key, [BR, NSP // NG, NG]), 1), 1), 0)
            # lo <= hi already (all NG groups reach +inf's bits only when N keys are forced, and
            # then so does hi), but without this clamp sm_90 (Triton 3.6) compiles the kernel to 236
            # registers and 3.3 KB of spills a thread (2 warps) instead of 70-72 and none
            lo = tl.minimum(lo, hi)
        else:  # a row narrower than N: fewer than N blocks visible, the answer is 0
            lo = tl.zeros([BR], dtype=tl.int32)
        differ = lo ^ hi  # [BR] >= 0
        # bit length of `differ` from its float exponent (rounding up only adds a round)
        length = tl.where(differ > 0, ((differ.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 126), 0)
        rounds = tl.minimum(tl.max(length, 0), 31)
        thr = lo & ~((tl.full([BR], 1, tl.int64) << rounds) - 1).to(tl.int32)
        for i in range(0, rounds):
            cand = thr | (1 << (rounds - 1 - i))
            enough = tl.sum((b_key >= cand[:, None]).to(tl.int32), 1) >= N
            thr = tl.where(enough, cand, thr)
    else:  # all 31 rounds, unrolled: the kernel before session 55 (for A/Bs, probe section topn_bounds)
        thr = tl.zeros([BR], dtype=tl.int32)
        for bit in tl.static_range(30, -1, -1):
            cand = thr | (1 << bit)
            enough = tl.sum((b_key >= cand[:, None]).to(tl.int32), 1) >= N
            thr = tl.where(enough, cand, thr)
    # -- keys above thr, then ties at thr by ascending block index --
    above = b_key > thr[:, None]
    need = N - tl.sum(above.to(tl.int32), 1)  # [BR]
    tie = b_key == thr[:, None]
    chosen = above | (tie & (tl.cumsum(tie.to(tl.int32), 1) <= need[:, None]))
    place = tl.cumsum(chosen.to(tl.int32), 1) - 1  # [BR, NSP] slot of each chosen block
    p_out = block_idx + ((i_b * TQ + T0 + i_t) * H + o_r % H) * N  # [BR]
    tl.store(p_out[:, None] + place, o_j[None, :] + tl.zeros([BR, NSP], dtype=tl.int32), mask=chosen)
    count = tl.sum(chosen.to(tl.int32), 1)
    o_n = tl.arange(0, NP)
    m_pad = (o_n[None, :] >= count[:, None]) & (o_n[None, :] < N) & m_r[:, None]
    tl.store(p_out[:, None] + o_n[None, :], tl.full([BR, NP], -1, tl.int32), mask=m_pad)


def row_warps(blocks: int) -> int:
    """Warps of a program whose rows hold ``blocks`` blocks in all: one up to :data:`ONE_WARP_BLOCKS`,
    beyond that one per 512 blocks (at most 16)."""
    return 1 if blocks <= ONE_WARP_BLOCKS else min(16, blocks // 512)


def block_topn(
    scores: torch.Tensor,
    block_idx: torch.Tensor,
    t0: int,
    t_first: int,
    sel_block: int,
    init_blocks: int,
    local_blocks: int,
    *,
    rows_per_program: Optional[int] = None,
    num_warps: Optional[int] = None,
) -> None:
    """Write ``block_idx[:, t0 : t0 + TC]`` from ``scores [B, TC, H, planes, nsel]``.

    Args:
        scores: float32 block masses of queries ``t0 ..`` (see the module docstring);
            only blocks up to each query's own count, so the rest (and plane ``s`` below
            block ``s``) may hold anything.
        block_idx: int32 ``[B, TQ, H, n]``, written in place.
        t0: first query of the chunk (an index into ``block_idx``'s time axis).
        t_first: absolute position of query ``t0`` (``q_offset + t0``).
        rows_per_program, num_warps: launch overrides (for tuning).
    """
    B, TC, H, planes, nsel = scores.shape
    TQ, n = block_idx.shape[1], block_idx.shape[3]
    rows = B * TC * H
    if rows == 0:
        return
    # the chunk's last query sees the most blocks: early chunks need narrower rows
    nsp = next_power_of_2(min(nsel, (t_first + TC - 1) // sel_block + 1))
    # one row per program; rows longer than a warp holds spread over warps
    br = rows_per_program or 1
    num_warps = num_warps or row_warps(br * nsp)
    np_ = next_power_of_2(n)
    block_topn_kernel[(cdiv(rows, br),)](
        scores, block_idx, rows, nsel, TC, TQ, t0, t_first,
        H=H, N=n, NP=np_, SEL=sel_block, INIT=init_blocks, LOCAL=local_blocks,
        BR=br, NSP=nsp, PLANES=planes, NG=min(nsp, np_), BOUNDS=LAUNCH["bounds"],
        num_warps=num_warps, **LAUNCH_OPTIONS,
    )


def compile_for_hopper(nsel: int = 1024, nsp: int = 1024, num_warps: Optional[int] = None):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU
    (:func:`nsa.ops._gluon.compile_for_sm90`): a launch over rows of ``nsp`` blocks (by default the 64k
    forward's last chunks: 1024 blocks) at the paper's geometry, on :func:`block_topn`'s warps unless
    ``num_warps`` is given, with ``nsel`` specialised as Triton's launcher does it (divisible by 16 or
    not) and the pointers 16-byte aligned. Returns Triton's compiled kernel (``asm``, ``metadata``)."""
    from nsa.ops._gluon import compile_for_sm90

    constexprs = dict(H=4, N=16, NP=16, SEL=64, INIT=1, LOCAL=2, BR=1, NSP=nsp, PLANES=2, NG=16, BOUNDS=True)
    signature = dict(scores="*fp32", block_idx="*i32", ROWS="i32", NSEL="i32", TC="i32", TQ="i32", T0="i32",
                     t_first="i32", **{name: "constexpr" for name in constexprs})
    aligned = ("scores", "block_idx") + (("NSEL",) if nsel % 16 == 0 else ())
    return compile_for_sm90(block_topn_kernel, signature, constexprs, dict(num_warps=num_warps or row_warps(nsp)),
                            aligned)
