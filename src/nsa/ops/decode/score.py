"""Launch 2 of a decode step: each program scores one tile of selection blocks of a (row, KV
group) from what the compressed pass left (:mod:`.sink`) and keeps the tile's n best keys as
its candidates (:mod:`.topn`)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, libdevice

from nsa.ops.decode.sink import mass_row_sections
from nsa.ops.decode.tiles import row_position, visible_cmp
from nsa.ops.decode.topn import pack_keys


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
    instead (:func:`~nsa.ops.decode.sink.store_block_mass`): a block's score is then its tile's
    mass, and for a tile's first block the previous tile's tail, each scaled by its tile's max
    against the head's log-sum-exp."""
    # positions and block indices in 32 bits: in 64 the masks and keys of the [BG, BJ] tile took
    # 112 of a one-warp program's 1304 instructions (SASS for sm_90a, batch 16, 64k)
    pos = pos.to(tl.int32)
    own = pos // SEL_BLOCK
    nc = visible_cmp(pos, CMP_BLOCK, CMP_STRIDE)
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
        at_max, at_tail = mass_row_sections(SINK_STRIDE, NBT)
        # tiles [BJ, BG], blocks first: the head sum then leaves each lane 4 of the tile's 32
        # keys, where [BG, BJ] tiles left it 16 (a one-warp program at batch 16, 64k: 936 SASS
        # instructions for sm_90a against 1112). On an H200, the two in turn three times, us:
        # batch 16 at 64k 73.7-73.9 against 77.2-77.4, at 32k 52.4-52.7 against 57.6-58.1,
        # batch 32 122.8-124.0 against 125.3-125.7, batch 64 228.8-228.9 against 237.6-238.2;
        # batch 16 at 8k 37.8-37.9 against 37.8-39.0
        p_rows = logits + i_rq[None, :] * SINK_STRIDE  # [1, BG]
        t_j = o_j // NBT
        # loads masked by the heads and the mass section alone (whole vectors of 4 blocks, 128-bit
        # loads), what is not visible set to 0 after them: the section's unwritten slots may hold
        # anything (872 SASS instructions against 936 with the visibility in the masks; on an
        # H200, three rounds in turn, us: batch 16 at 64k 72.9-73.5 against 73.5-73.9, at 8k
        # 37.0-37.3 against 37.4-37.5, batch 32 123.0-123.7 against 123.4-124.0, batch 64 equal)
        m_sec = m_g[None, :] & (o_j < at_max)[:, None]
        vis = ((t_j * CMP_TILE < nc) & (o_j <= own))[:, None]
        b_ref = tl.load(p_rows + at_max + t_j[:, None], mask=m_sec, other=float("-inf"))
        b_mass = tl.load(p_rows + o_j[:, None], mask=m_sec, other=0.0, eviction_policy=DROP)
        b_score = tl.sum(tl.where(vis, tl.exp2(b_ref - b_lse[None, :]) * b_mass, 0.0), 1)
        first = (o_j % NBT == 0) & (o_j > 0) & (t_j * CMP_TILE <= nc) & (o_j <= own)
        m_tail = m_g[None, :] & first[:, None]
        b_ref = tl.load(p_rows + at_max + t_j[:, None] - 1, mask=m_tail, other=float("-inf"))
        b_tail = tl.load(p_rows + at_tail + t_j[:, None] - 1, mask=m_tail, other=0.0)
        b_score += tl.sum(tl.exp2(b_ref - b_lse[None, :]) * b_tail, 1)
    elif CONTIG:
        # Block j starts at token j*R (R = l'/d): its tokens j*R + r (r < R) are the
        # tile's one contiguous range [j0*R, (j0 + BJ)*R), read once and folded [BJ, R]
        # with weights min(l, (R - r)*d)/l; the C - 1 tokens j*R - u before it (C = l/d)
        # reach into the block by min(l - u*d, l') and are gathered, one load each.
        o_c = j0 * R + tl.arange(0, BJ * R)
        m_c = (o_c < nc) & (o_c // R <= own)
        # tiles [tokens, heads], as for the masses above (a 4-warp program at batch 1, 64k: 592
        # SASS instructions for sm_90a against 728 as [heads, tokens]; on an H200 the batch-1
        # step the same within noise at 8k-64k, three rounds in turn). The rows' pointers are
        # computed in each branch: hoisted above them, this program compiled to 624.
        p_rows = logits + i_rq[None, :] * SINK_STRIDE  # [1, BG]
        b_s = tl.load(p_rows + o_c[:, None], mask=m_g[None, :] & m_c[:, None], other=float("-inf"), eviction_policy=DROP)
        b_pc = tl.sum(tl.exp2(b_s - b_lse[None, :]), 1)  # [BJ*R] group probability (Eq. 10)
        o_r = tl.arange(0, R)
        b_wr = tl.minimum(CMP_BLOCK, (R - o_r) * CMP_STRIDE).to(tl.float32) / CMP_BLOCK  # [R]
        b_score = tl.sum(tl.reshape(b_pc, (BJ, R)) * b_wr[None, :], 1)
        for u in tl.static_range(1, CMP_BLOCK // CMP_STRIDE):
            o_i = o_j * R - u
            m_i = (o_i >= 0) & (o_i < nc) & (o_j <= own)
            b_s = tl.load(p_rows + o_i[:, None], mask=m_g[None, :] & m_i[:, None], other=float("-inf"))
            b_pg = tl.sum(tl.exp2(b_s - b_lse[None, :]), 1)
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
    return o_j, pack_keys(b_score, o_j, own, INIT, LOCAL)


def reserve_shared_asm(nbytes: int) -> str:
    """Inline PTX for :func:`decode_score_kernel`'s ``CAP_ASM``: it declares a static shared-memory
    array of ``nbytes`` (at most 48 KiB, the static limit) that nothing reads, and passes its operand
    through unchanged (plus the array's address times zero, so that ptxas keeps the array). Each
    program then holds that much more shared memory, which caps the programs an SM."""
    if not 0 < nbytes <= 48 * 1024:
        raise ValueError(f"a static shared array takes 1 to 49152 bytes, not {nbytes}")
    return ("{ .shared .align 16 .b8 nsa_score_cap[%d]; .reg .u32 a; mov.u32 a, nsa_score_cap; and.b32 a, a, 0; "
            "add.u32 $0, $1, a; }" % nbytes)


@triton.jit
def decode_score_kernel(
    seq_lens, logits, m_part, l_part, cand,  #
    SINK_STRIDE, NCAND, S_CMP, S,  #
    TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr,  #
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr,  #
    N: tl.constexpr, NP: tl.constexpr, INIT: tl.constexpr, LOCAL: tl.constexpr,  #
    BG: tl.constexpr, BSC: tl.constexpr, BJ: tl.constexpr, NCOVER: tl.constexpr, PDL: tl.constexpr,
    CONTIG: tl.constexpr, R: tl.constexpr, DROP: tl.constexpr, MASS: tl.constexpr, CMP_TILE: tl.constexpr,
    CAP_ASM: tl.constexpr,
    SORTED: tl.constexpr, FAST_LOG2: tl.constexpr, RUN_BIT: tl.constexpr,
):
    """Keys of blocks ``[j0, j0 + BJ)`` (:func:`_score_tile`), kept in registers: the
    program writes only its tile's ``N`` best keys (the candidates) into the tile's ``NP``
    slots, padded with -1. The global top-n lies among the candidates of all tiles. Tile-major
    slots in ascending block order keep a row's candidates in ascending block order (what
    the rounds of the selection programs take); with ``SORTED`` each tile's slots hold its
    keys sorted, largest first where bit ``RUN_BIT`` of the tile's index is 0 and last where it
    is 1 (what one bitonic merge of runs takes, :func:`~nsa.ops.decode.topn.top_of_sorted_runs`;
    ``RUN_BIT`` from :func:`~nsa.ops.decode.topn.run_bit`). ``CAP_ASM`` (:func:`reserve_shared_asm`,
    or None) reserves shared memory that nothing uses, to cap the programs an SM."""
    if PDL:
        gdc_launch_dependents()
    i_j, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    _, pos = row_position(seq_lens, i_r, TQ)
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
        if CAP_ASM is not None:
            # a static shared-memory array that nothing reads, so that fewer programs fit an SM
            n_found = tl.inline_asm_elementwise(CAP_ASM, "=r,r", [n_found], dtype=tl.int32, is_pure=True, pack=1)
        o_n = tl.arange(0, NP)
        p_c = cand + i_rh.to(tl.int64) * NCAND + i_j * NP
        if SORTED:
            # the candidates are the keys ranked 0 .. n_found - 1: a sorted run for
            # top_of_sorted_runs, descending or ascending by the bit its first level pairs
            up = (i_j >> RUN_BIT) & 1
            tl.store(p_c + tl.where(up == 1, NP - 1 - b_rank, b_rank), b_key, mask=b_cand)
            pad = tl.where(up == 1, o_n < NP - n_found, o_n >= n_found)
        else:
            tl.store(p_c + tl.cumsum(b_cand.to(tl.int32), 0) - 1, b_key, mask=b_cand)
            pad = o_n >= n_found
        tl.store(p_c + o_n, tl.full([NP], -1, tl.int64), mask=pad)
