"""Launch 4 of a decode step: each program merges the partials of every branch for a few heads and
applies the gates (or first computes them from the hidden state, given a gate projection)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


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
def _load_acc_chunk(o_part, m_part, o_h, s0, hi, S, V: tl.constexpr, BSX: tl.constexpr, BV: tl.constexpr,
                    DROP: tl.constexpr, CACHE: tl.constexpr):
    """Slots ``[s0, min(s0 + BSX, hi))`` of heads ``o_h`` (rows of ``S`` slots): max ``[HB, BSX]``
    and acc ``[HB, BSX, BV]``."""
    o_x = s0 + tl.arange(0, BSX)
    o_v = tl.arange(0, BV)
    m_x = o_x < hi
    p_x = o_h[:, None] * S + o_x[None, :]  # [HB, BSX]
    b_mx = tl.load(m_part + p_x, mask=m_x[None, :], other=float("-inf"), eviction_policy=DROP, cache_modifier=CACHE)
    b_acc = tl.load(o_part + p_x[:, :, None] * V + o_v[None, None, :], mask=m_x[None, :, None] & (o_v[None, None, :] < V), other=0.0,
                    eviction_policy=DROP, cache_modifier=CACHE)  # fmt: skip
    return b_mx, b_acc


@triton.jit
def _gated_chunk(b_mx, b_acc, s0, hi, S_CMP, S_WIN, b_ref_cmp, b_ref_win, b_ref_slc, b_sc_cmp, b_sc_win, b_sc_slc, BSX: tl.constexpr):
    """``sum_s gate * exp2(m_s - ref) / sum * acc_s`` over one chunk of slots ``[HB, BV]``,
    each slot scaled by its branch's reference max and ``gate / sum``."""
    o_x = s0 + tl.arange(0, BSX)
    is_cmp = (o_x < S_CMP)[None, :]
    is_win = ((o_x >= S_CMP) & (o_x < S_CMP + S_WIN))[None, :]
    b_ref = tl.where(is_cmp, b_ref_cmp[:, None], tl.where(is_win, b_ref_win[:, None], b_ref_slc[:, None]))
    b_scale = tl.where(is_cmp, b_sc_cmp[:, None], tl.where(is_win, b_sc_win[:, None], b_sc_slc[:, None]))
    b_coef = tl.where((o_x < hi)[None, :], tl.exp2(b_mx - b_ref) * b_scale, 0.0)  # [HB, BSX]
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
def _merge_slots(o_part, m_part, l_part, o_h, lo, hi, S, S_CMP, S_WIN, b_g_cmp, b_g_slc, b_g_win,  #
                 V: tl.constexpr, BS: tl.constexpr, BSX: tl.constexpr, BV: tl.constexpr, DROP: tl.constexpr,
                 CACHE: tl.constexpr):
    """The gated output ``[HB, BV]`` of the branches whose slots lie in ``[lo, hi)`` (whole
    branches; rows of ``S`` slots): each branch's partials merged under its own max and sum.
    The first chunk of ``acc`` is loaded with the ``(max, sum)``, not after them: usually it is
    the only one, and the program then waits on memory once."""
    o_s = lo + tl.arange(0, BS)
    m_s = o_s < hi
    p_s = o_h[:, None] * S + o_s[None, :]
    b_m = tl.load(m_part + p_s, mask=m_s[None, :], other=float("-inf"), eviction_policy=DROP, cache_modifier=CACHE)  # [HB, BS]
    b_l = tl.load(l_part + p_s, mask=m_s[None, :], other=0.0, eviction_policy=DROP, cache_modifier=CACHE)
    b_mx0, b_acc0 = _load_acc_chunk(o_part, m_part, o_h, lo, hi, S, V, BSX, BV, DROP, CACHE)
    m_cmp = ((o_s < S_CMP) & m_s)[None, :]
    m_win = ((o_s >= S_CMP) & (o_s < S_CMP + S_WIN) & m_s)[None, :]
    m_slc = ((o_s >= S_CMP + S_WIN) & m_s)[None, :]
    b_ref_cmp, b_ref_win, b_ref_slc = _branch_norm(b_m, m_cmp), _branch_norm(b_m, m_win), _branch_norm(b_m, m_slc)
    b_sc_cmp = _branch_scale(b_m, b_l, m_cmp, b_ref_cmp, b_g_cmp)
    b_sc_win = _branch_scale(b_m, b_l, m_win, b_ref_win, b_g_win)
    b_sc_slc = _branch_scale(b_m, b_l, m_slc, b_ref_slc, b_g_slc)
    b_o = _gated_chunk(b_mx0, b_acc0, lo, hi, S_CMP, S_WIN, b_ref_cmp, b_ref_win, b_ref_slc,
                       b_sc_cmp, b_sc_win, b_sc_slc, BSX)  # fmt: skip
    for s0 in range(lo + BSX, hi, BSX):
        b_mx, b_acc = _load_acc_chunk(o_part, m_part, o_h, s0, hi, S, V, BSX, BV, DROP, CACHE)
        b_o += _gated_chunk(b_mx, b_acc, s0, hi, S_CMP, S_WIN, b_ref_cmp, b_ref_win, b_ref_slc,
                            b_sc_cmp, b_sc_win, b_sc_slc, BSX)  # fmt: skip
    return b_o


@triton.jit
def decode_combine_kernel(
    o_part, m_part, l_part, gates, o, gate_w, gate_b,  #
    S_CMP, S_WIN, S, S_EARLY, HQ, HIDDEN, stride_gx,  #
    V: tl.constexpr, HB: tl.constexpr, BS: tl.constexpr, BSX: tl.constexpr, BSE: tl.constexpr, BSXE: tl.constexpr,
    BV: tl.constexpr, PDL: tl.constexpr,
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
    split count (:func:`_merge_slots`; ``BS``/``BSX`` cover the slots after ``S_EARLY``,
    ``BSE``/``BSXE`` those before). The first ``S_EARLY`` slots (launch 1's: the compressed
    splits, and the window's where launch 1 runs them) are merged before the wait for the launch
    before; the caller passes 0 unless launch 1 is known complete when this launch starts.
    Partials are read with the L2 eviction policy ``DROP``: nothing reads them again."""
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
    if S_EARLY > 0:
        # launch 1's slots are complete before this program starts (see decode_fwd): merged
        # while the selection programs still run, read through L2 alone (ptxas takes no
        # eviction policy with .cg)
        b_o = _merge_slots(o_part, m_part, l_part, o_h, 0, S_EARLY, S, S_CMP, S_WIN, b_g_cmp, b_g_slc, b_g_win,
                           V, BSE, BSXE, BV, "", ".cg")  # fmt: skip
    else:
        b_o = tl.zeros([HB, BV], tl.float32)
    if PDL:
        gdc_wait()
    b_o += _merge_slots(o_part, m_part, l_part, o_h, S_EARLY, S, S, S_CMP, S_WIN, b_g_cmp, b_g_slc, b_g_win,
                        V, BS, BSX, BV, DROP, "")  # fmt: skip
    tl.store(o + o_h[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=o_v[None, :] < V)
