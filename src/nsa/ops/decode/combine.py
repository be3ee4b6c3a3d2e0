"""Launch 4 of a decode step: each program merges the partials of every branch for a few heads and
applies the gates (or first computes them from the hidden state, given a gate projection)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


@triton.jit
def _branch_loads(o_part, m_part, l_part, o_h, lo, hi, S, V: tl.constexpr, BS: tl.constexpr, BSX: tl.constexpr,
                  BV: tl.constexpr, DROP: tl.constexpr, CACHE: tl.constexpr):
    """One branch's slots ``[lo, hi)`` of heads ``o_h`` (rows of ``S`` slots): max and sum
    ``[HB, BS]`` and the acc of its first ``BSX`` slots ``[HB, BSX, BV]``, all requested at once
    (usually the first chunk is the only one: the program then waits on memory once)."""
    o_s = lo + tl.arange(0, BS)
    m_s = o_s < hi
    p_s = o_h[:, None] * S + o_s[None, :]
    b_m = tl.load(m_part + p_s, mask=m_s[None, :], other=float("-inf"), eviction_policy=DROP, cache_modifier=CACHE)
    b_l = tl.load(l_part + p_s, mask=m_s[None, :], other=0.0, eviction_policy=DROP, cache_modifier=CACHE)
    b_acc = _load_acc(o_part, o_h, lo, hi, S, V, BSX, BV, DROP, CACHE)
    return b_m, b_l, b_acc


@triton.jit
def _load_acc(o_part, o_h, s0, hi, S, V: tl.constexpr, BSX: tl.constexpr, BV: tl.constexpr, DROP: tl.constexpr,
              CACHE: tl.constexpr):
    """The acc ``[HB, BSX, BV]`` of slots ``[s0, min(s0 + BSX, hi))``, zero past ``hi``."""
    o_x = s0 + tl.arange(0, BSX)
    o_v = tl.arange(0, BV)
    p_x = (o_h[:, None] * S + o_x[None, :])[:, :, None] * V + o_v[None, None, :]
    return tl.load(o_part + p_x, mask=(o_x < hi)[None, :, None] & (o_v[None, None, :] < V), other=0.0,
                   eviction_policy=DROP, cache_modifier=CACHE)


@triton.jit
def _branch_output(o_part, m_part, o_h, lo, hi, S, b_m, b_l, b_acc, b_g,  #
                   V: tl.constexpr, BS: tl.constexpr, BSX: tl.constexpr, BV: tl.constexpr, DROP: tl.constexpr,
                   CACHE: tl.constexpr):
    """``gate * sum_s exp2(m_s - max) acc_s / sum_s exp2(m_s - max) l_s`` ``[HB, BV]`` of one
    branch (:func:`_branch_loads`); a branch with nothing visible (sum 0) contributes 0. Past
    the first chunk the acc is read ``BSX`` slots at a time, with each chunk's max again."""
    b_mx = tl.max(b_m, 1)
    b_mx = tl.where(b_mx == float("-inf"), 0.0, b_mx)
    b_w = tl.exp2(b_m - b_mx[:, None])  # [HB, BS], 0 where masked
    b_sum = tl.sum(b_w * b_l, 1)
    b_scale = tl.where(b_sum > 0, b_g / tl.where(b_sum > 0, b_sum, 1.0), 0.0)
    if BSX == BS:
        b_o = tl.sum(b_w[:, :, None] * b_acc, 1)
    else:
        b_o = tl.sum(_chunk_weights(m_part, o_h, lo, hi, S, b_mx, BSX, DROP, CACHE)[:, :, None] * b_acc, 1)
        for s0 in range(lo + BSX, hi, BSX):
            b_wc = _chunk_weights(m_part, o_h, s0, hi, S, b_mx, BSX, DROP, CACHE)
            b_o += tl.sum(b_wc[:, :, None] * _load_acc(o_part, o_h, s0, hi, S, V, BSX, BV, DROP, CACHE), 1)
    return b_o * b_scale[:, None]


@triton.jit
def _chunk_weights(m_part, o_h, s0, hi, S, b_mx, BSX: tl.constexpr, DROP: tl.constexpr, CACHE: tl.constexpr):
    """``exp2(m_s - max)`` ``[HB, BSX]`` of slots ``[s0, s0 + BSX)``, 0 past ``hi``."""
    o_x = s0 + tl.arange(0, BSX)
    b_mc = tl.load(m_part + o_h[:, None] * S + o_x[None, :], mask=(o_x < hi)[None, :], other=float("-inf"),
                   eviction_policy=DROP, cache_modifier=CACHE)
    return tl.exp2(b_mc - b_mx[:, None])


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
def decode_combine_kernel(
    o_part, m_part, l_part, gates, o, gate_w, gate_b,  #
    S_CMP, S_WIN, S, HQ, HIDDEN, stride_gx,  #
    V: tl.constexpr, HB: tl.constexpr, BV: tl.constexpr,  #
    BSC: tl.constexpr, BSXC: tl.constexpr, BSW: tl.constexpr, BSXW: tl.constexpr, BSS: tl.constexpr, BSXS: tl.constexpr,
    EARLY: tl.constexpr, WIN_EARLY: tl.constexpr, PDL: tl.constexpr,
    DROP: tl.constexpr, GATE_PROJ: tl.constexpr, BKG: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Heads ``[i*HB, (i+1)*HB)`` of the flattened ``rows * HQ``: merge each branch's
    splits and apply the gates. ``gates [rows*HQ, 3]``, ``o [rows*HQ, V]``; with
    ``GATE_PROJ``, ``gates`` is the hidden state ``x`` (rows ``stride_gx`` apart, ``HIDDEN``
    wide) and each gate ``sigmoid(x . gate_w[3 * head + branch] + gate_b[...])``, computed
    before the wait for the launch before (nothing of it comes from there).

    Slots: compressed ``[0, S_CMP)``, window ``[S_CMP, S_CMP + S_WIN)``, selected after;
    gates (cmp, slc, win). Each branch is merged under its own max and sum in tiles of its own
    width (``BSC``, ``BSW``, ``BSS`` slots for the max and sum, the acc ``BSXC``, ``BSXW``,
    ``BSXS`` at a time). With ``EARLY`` launch 1's branches (the compressed one, and the window
    with ``WIN_EARLY``) are merged before the wait for the launch before: the caller sets it only
    where launch 1 is complete when this launch starts (see ``decode_fwd``); they are then read
    through L2 alone. Every branch after the wait is requested before any is merged. Partials
    are read with the L2 eviction policy ``DROP``: nothing reads them again."""
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
    CMP_LATE: tl.constexpr = not EARLY
    WIN_LATE: tl.constexpr = not (EARLY and WIN_EARLY)
    lo_w, lo_s = S_CMP, S_CMP + S_WIN
    b_o = tl.zeros([HB, BV], tl.float32)
    if EARLY:
        # launch 1 is complete: its branches merged while the selection programs still run,
        # read through L2 alone (ptxas takes no eviction policy with .cg)
        c_m, c_l, c_a = _branch_loads(o_part, m_part, l_part, o_h, 0, S_CMP, S, V, BSC, BSXC, BV, "", ".cg")
        if WIN_EARLY:
            w_m, w_l, w_a = _branch_loads(o_part, m_part, l_part, o_h, lo_w, lo_s, S, V, BSW, BSXW, BV, "", ".cg")
        b_o += _branch_output(o_part, m_part, o_h, 0, S_CMP, S, c_m, c_l, c_a, b_g_cmp, V, BSC, BSXC, BV, "", ".cg")
        if WIN_EARLY:
            b_o += _branch_output(o_part, m_part, o_h, lo_w, lo_s, S, w_m, w_l, w_a, b_g_win, V, BSW, BSXW, BV, "", ".cg")
    if PDL:
        gdc_wait()
    if CMP_LATE:
        c_m, c_l, c_a = _branch_loads(o_part, m_part, l_part, o_h, 0, S_CMP, S, V, BSC, BSXC, BV, DROP, "")
    if WIN_LATE:
        w_m, w_l, w_a = _branch_loads(o_part, m_part, l_part, o_h, lo_w, lo_s, S, V, BSW, BSXW, BV, DROP, "")
    s_m, s_l, s_a = _branch_loads(o_part, m_part, l_part, o_h, lo_s, S, S, V, BSS, BSXS, BV, DROP, "")
    if CMP_LATE:
        b_o += _branch_output(o_part, m_part, o_h, 0, S_CMP, S, c_m, c_l, c_a, b_g_cmp, V, BSC, BSXC, BV, DROP, "")
    if WIN_LATE:
        b_o += _branch_output(o_part, m_part, o_h, lo_w, lo_s, S, w_m, w_l, w_a, b_g_win, V, BSW, BSXW, BV, DROP, "")
    b_o += _branch_output(o_part, m_part, o_h, lo_s, S, S, s_m, s_l, s_a, b_g_slc, V, BSS, BSXS, BV, DROP, "")
    tl.store(o + o_h[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=o_v[None, :] < V)
