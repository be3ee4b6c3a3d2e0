"""The compressed splits' values, taken apart from launch 1 (``values_apart`` of
:func:`~nsa.ops.decode.kernel.decode_fwd`).

Scoring needs only the compressed keys: the block masses and each split's max and sum. The
values serve the compressed branch's output alone, which nothing reads before the combine
launch. So launch 1 can leave each tile's softmax weights (in the values' dtype, as its
product would take them) beside the tile's max, which the block masses already carry, and
this kernel, on a stream of its own between launch 1 and the combine, builds each split's
accumulator from them and the values: launch 1 reads half the bytes, and this one reads the
other half while the score and selected launches, which move few bytes for their time, run.

It walks each split's tiles as launch 1 did (the same split sizes, whole tiles through tensor
descriptors with ``DESC``, a masked last tile through plain loads) and rescales the accumulator
by the same factors (:func:`~nsa.ops.decode.tiles.accumulate_values`), so the accumulators equal
launch 1's own bitwise.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nsa.ops.decode.sink import mass_row_sections
from nsa.ops.decode.tiles import accumulate_values, load_token_tile, row_position, store_partial, visible_cmp


@triton.jit
def _values_tile(b_acc, b_m, b_v, p_w, p_max, i0, m_t, m_g, BC: tl.constexpr, PREC: tl.constexpr,
                 DROP: tl.constexpr):
    """One tile: its weights ``[BG, BC]`` (zero where not ``m_t``), its max, then the
    accumulator rescaled from the previous tile's max and the tile's product added."""
    o_t = i0 + tl.arange(0, BC)
    b_ref = tl.load(p_max + i0 // BC, mask=m_g, other=0.0, eviction_policy=DROP)
    b_p = tl.load(p_w[:, None] + o_t[None, :], mask=m_g[:, None] & m_t[None, :], other=0.0, eviction_policy=DROP)
    return accumulate_values(b_acc, tl.exp2(b_m - b_ref), b_p, b_v, PREC), b_ref


@triton.jit
def decode_cmp_values_kernel(
    seq_lens, d_v, v_cmp, logits, weights, o_part, m_part, l_part,  #
    s_vcb, s_vct, s_vch, SINK_STRIDE, s_wg, S_CMP, S,  #
    TQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, V: tl.constexpr, BG: tl.constexpr, BV: tl.constexpr,
    BC: tl.constexpr, R: tl.constexpr, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, PREC: tl.constexpr,
    DESC: tl.constexpr, KEEP: tl.constexpr, DROP: tl.constexpr,
):
    """Grid ``(S_CMP, rows * H)``: the accumulator of compressed split ``program_id(0)`` of (row,
    KV group) ``program_id(1)`` into its ``o_part`` slot, from launch 1's ``weights`` (rows of
    ``s_wg``) and tile maxima (the max section of the block-mass rows of ``logits``,
    :func:`~nsa.ops.decode.sink.mass_row_sections`) and the values ``v_cmp`` (``d_v`` its
    descriptor with ``DESC``)."""
    i_s, i_rh = tl.program_id(0), tl.program_id(1)
    i_r, i_h = i_rh // H, i_rh % H
    i_b, pos = row_position(seq_lens, i_r, TQ)
    nc = visible_cmp(pos, CMP_BLOCK, CMP_STRIDE)
    chunk = tl.cdiv(tl.cdiv(nc, S_CMP), BC) * BC  # launch 1's split
    lo = i_s * chunk
    hi = tl.minimum(lo + chunk, nc)
    o_g = tl.arange(0, BG)
    m_g = o_g < G
    rows = (i_r * (H * G) + i_h * G + o_g).to(tl.int64)  # [BG] global head rows
    at_max, _ = mass_row_sections(SINK_STRIDE, BC // R)
    p_max = logits + rows * SINK_STRIDE + at_max
    p_w = weights + rows * s_wg
    b_m = tl.full([BG], float("-inf"), tl.float32)
    b_acc = tl.zeros([BG, BV], tl.float32)
    if DESC:
        whole = tl.maximum(lo + (hi - lo) // BC * BC, lo)
        for i0 in range(lo.to(tl.int32), whole.to(tl.int32), BC):
            b_v = d_v.load([i_b.to(tl.int32), i0, i_h.to(tl.int32), 0]).reshape(BC, BV)
            b_acc, b_m = _values_tile(b_acc, b_m, b_v, p_w, p_max, i0, tl.arange(0, BC) >= 0, m_g, BC, PREC, DROP)
        lo = whole
    p_v = v_cmp + i_b * s_vcb + i_h * s_vch
    for i0 in range(lo, hi, BC):
        b_v = load_token_tile(p_v, s_vct, i0, hi, V, BV, BC)
        b_acc, b_m = _values_tile(b_acc, b_m, b_v, p_w, p_max, i0, i0 + tl.arange(0, BC) < hi, m_g, BC, PREC, DROP)
    store_partial(o_part, m_part, l_part, i_r, i_h, i_s, S, b_m, b_m, b_acc, H * G, G, V, BG, BV, KEEP, STATS=False)
