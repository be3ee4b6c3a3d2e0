"""What the compressed pass leaves for the score launch, per head and tile of compressed tokens:
every logit, or, once the batch fills the GPU, the tile's selection-block masses (a quarter of
the bytes), and the layout of such a row."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mass_row_sections(s_sg, NBT: tl.constexpr):
    """Offsets of the max and tail sections of a block-mass row of ``s_sg`` floats, laid out
    ``[mass (NT*NBT) | max (NT) | tail (NT)]`` for ``NT`` tiles of ``NBT`` blocks."""
    n_tiles = s_sg // (NBT + 2)
    return n_tiles * NBT, n_tiles * (NBT + 1)


@triton.jit
def store_block_mass(b_p, b_ref, i0, p_s, s_sg, G: tl.constexpr, BG: tl.constexpr, BC: tl.constexpr, R: tl.constexpr,
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
    at_max, at_tail = mass_row_sections(s_sg, NBT)
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
def store_scores(b_s, b_m, i0, m_t, p_s, s_sg, G: tl.constexpr, BG: tl.constexpr, BC: tl.constexpr,
                 STORE_S: tl.constexpr, KEEP: tl.constexpr, R: tl.constexpr, CMP_BLOCK: tl.constexpr,
                 CMP_STRIDE: tl.constexpr, SEL_BLOCK: tl.constexpr):
    """What a compressed tile leaves for scoring (``STORE_S``): 1, its logits ``b_s [BG, BC]``
    (rows of ``p_s``, head stride ``s_sg``, tokens ``m_t``); 2, its block masses
    (:func:`store_block_mass`) relative to the running max after the tile (``b_m`` before it)."""
    if STORE_S == 1:
        o_g = tl.arange(0, BG)
        o_t = i0 + tl.arange(0, BC)
        tl.store(p_s + o_g[:, None].to(tl.int64) * s_sg + o_t[None, :], b_s, mask=(o_g[:, None] < G) & m_t[None, :],
                 eviction_policy=KEEP)
    elif STORE_S == 2:
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_ref = tl.where(b_mn == float("-inf"), 0.0, b_mn)
        store_block_mass(tl.exp2(b_s - b_ref[:, None]), b_ref, i0, p_s, s_sg, G, BG, BC, R, CMP_BLOCK, CMP_STRIDE,
                         SEL_BLOCK, KEEP)  # fmt: skip
