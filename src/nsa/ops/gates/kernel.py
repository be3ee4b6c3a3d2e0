"""Gated sum of the branches: Triton kernels, forward and backward.

Same function as :mod:`nsa.ops.gates.reference`. PyTorch would run the sum as
five elementwise kernels with temporaries (and the backward as more): at 64k
tokens and 64 heads each branch output is 1 GiB, so the passes over memory,
not arithmetic, decide the time. Here each direction is one pass:

- forward reads the three outputs and the gates once and writes ``o``;
- backward reads ``do``, the three outputs and the gates once and writes the
  three output gradients and ``dgates`` (row sums in float32); for training
  (:mod:`nsa.ops.training`) it can write only ``dgates`` and each branch's
  ``rowsum(o_branch * do)``, the branches' kernels applying the gates themselves.

Each program owns ``BR`` rows of ``[B*T*HQ, Dv]``; arithmetic is float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2


@triton.jit
def _tiles(i_p, ROWS, DV: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    o_r = i_p.to(tl.int64) * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    m_r = o_r < ROWS
    return o_r, m_r, o_r[:, None] * DV + o_d[None, :], m_r[:, None] & (o_d < DV)[None, :]


@triton.jit
def _load_gates(gates, o_r, m_r):
    """``(g_cmp, g_slc, g_win)`` in float32 of rows ``o_r`` of ``gates [rows, 3]``."""
    g_cmp = tl.load(gates + o_r * 3, mask=m_r, other=0.0).to(tl.float32)
    g_slc = tl.load(gates + o_r * 3 + 1, mask=m_r, other=0.0).to(tl.float32)
    g_win = tl.load(gates + o_r * 3 + 2, mask=m_r, other=0.0).to(tl.float32)
    return g_cmp, g_slc, g_win


@triton.jit
def gated_sum(gates, o_cmp, o_slc, o_win, b_own, o_r, m_r, p_x, m_x, OWN: tl.constexpr):
    """``g_cmp * o_cmp + g_slc * o_slc + g_win * o_win`` in float32 for rows ``o_r`` of
    ``[rows, Dv]`` (elements ``p_x``, masks ``m_r``/``m_x``). ``b_own`` is the output of
    branch ``OWN`` (1 selected, 2 window) already in registers; the other two are loaded.
    One order of summation for every caller (this kernel, the window kernel's and the
    selected kernel's epilogues), so their results are bitwise equal. The multiply-adds
    are explicit: left to the compiler, ``a*b + c*d`` is contracted into either of two fused
    multiply-adds depending on the surrounding code, which changes float32 results (16-bit
    operands multiply exactly in float32, so only float32 inputs could tell)."""
    g_cmp, g_slc, g_win = _load_gates(gates, o_r, m_r)
    b_o = g_cmp[:, None] * tl.load(o_cmp + p_x, mask=m_x, other=0.0).to(tl.float32)
    if OWN == 1:
        b_o = tl.fma(g_slc[:, None], b_own, b_o)
        b_o = tl.fma(g_win[:, None], tl.load(o_win + p_x, mask=m_x, other=0.0).to(tl.float32), b_o)
    else:
        b_o = tl.fma(g_slc[:, None], tl.load(o_slc + p_x, mask=m_x, other=0.0).to(tl.float32), b_o)
        b_o = tl.fma(g_win[:, None], b_own, b_o)
    return b_o


@triton.jit(do_not_specialize=["ROWS"])
def gates_fwd_kernel(gates, o_cmp, o_slc, o_win, o, ROWS, DV: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    o_r, m_r, p_x, m_x = _tiles(tl.program_id(0), ROWS, DV, BR, BD)
    b_win = tl.load(o_win + p_x, mask=m_x, other=0.0).to(tl.float32)
    b_o = gated_sum(gates, o_cmp, o_slc, o_win, b_win, o_r, m_r, p_x, m_x, 2)
    tl.store(o + p_x, b_o.to(o.dtype.element_ty), mask=m_x)


@triton.jit
def _branch_bwd(p_o, p_do, b_do, g, dgates, delta, o_r, m_r, p_x, m_x, ROWS, SLOT: tl.constexpr, DELTA: tl.constexpr,
                STORE_DO: tl.constexpr):
    """``dgate = rowsum(do * o_branch)`` of one branch and, with ``STORE_DO``, ``do_branch = g *
    do``. With ``DELTA`` the row sum is also stored in float32 as the branch's softmax-backward
    ``delta``: its kernels, given the gate, take ``dS = g P * (dP - rowsum(o * do))`` with the
    ungated ``do`` (``nsa.ops._triton.attention``), and would otherwise read both tensors again."""
    b_x = tl.load(p_o + p_x, mask=m_x, other=0.0).to(tl.float32)
    if STORE_DO:
        tl.store(p_do + p_x, (g[:, None] * b_do).to(p_do.dtype.element_ty), mask=m_x)
    b_dg = tl.sum(b_do * b_x, 1)
    tl.store(dgates + o_r * 3 + SLOT, b_dg.to(dgates.dtype.element_ty), mask=m_r)
    if DELTA:
        tl.store(delta + SLOT * ROWS + o_r, b_dg, mask=m_r)


@triton.jit(do_not_specialize=["ROWS"])
def gates_bwd_kernel(
    gates, o_cmp, o_slc, o_win, do, dgates, do_cmp, do_slc, do_win,
    delta,  # [3, ROWS] float32, written with DELTA
    ROWS, DV: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, DELTA: tl.constexpr, STORE_DO: tl.constexpr,
):
    o_r, m_r, p_x, m_x = _tiles(tl.program_id(0), ROWS, DV, BR, BD)
    b_do = tl.load(do + p_x, mask=m_x, other=0.0).to(tl.float32)
    g_cmp, g_slc, g_win = _load_gates(gates, o_r, m_r)
    _branch_bwd(o_cmp, do_cmp, b_do, g_cmp, dgates, delta, o_r, m_r, p_x, m_x, ROWS, 0, DELTA, STORE_DO)
    _branch_bwd(o_slc, do_slc, b_do, g_slc, dgates, delta, o_r, m_r, p_x, m_x, ROWS, 1, DELTA, STORE_DO)
    _branch_bwd(o_win, do_win, b_do, g_win, dgates, delta, o_r, m_r, p_x, m_x, ROWS, 2, DELTA, STORE_DO)


def _launch(dv: int):
    bd = next_power_of_2(dv)
    br = max(1, 4096 // bd)  # ~32 elements per thread and tensor at 4 warps
    return br, bd


def gates_fwd(gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, o_win: torch.Tensor) -> torch.Tensor:
    """Launch the forward on contiguous inputs: the gated sum, in the branches' dtype."""
    o = torch.empty_like(o_cmp)
    rows, dv = o_cmp.numel() // max(o_cmp.shape[-1], 1), o_cmp.shape[-1]
    br, bd = _launch(dv)
    if o.numel():
        gates_fwd_kernel[(cdiv(rows, br),)](gates, o_cmp, o_slc, o_win, o, rows, DV=dv, BR=br, BD=bd,
                                                    **LAUNCH_OPTIONS)
    return o


def gates_bwd(gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, o_win: torch.Tensor, do: torch.Tensor,
              with_delta: bool = False, store_do: bool = True):
    """Launch the backward on contiguous inputs: ``(dgates, do_cmp, do_slc, do_win, delta)``,
    ``delta`` float32 ``[3, B, T, HQ]`` (each branch's ``rowsum(o_branch * do)``, the delta of
    its backward when given the gate) with ``with_delta``, else None. Without ``store_do`` the
    three ``do_branch`` are None (the branches' backwards then take ``do`` and their gate)."""
    dgates = torch.empty_like(gates)
    d_cmp, d_slc, d_win = (torch.empty_like(o_cmp) if store_do else None for _ in range(3))
    delta = torch.empty(3, *o_cmp.shape[:-1], dtype=torch.float32, device=do.device) if with_delta else None
    rows, dv = o_cmp.numel() // max(o_cmp.shape[-1], 1), o_cmp.shape[-1]
    br, bd = _launch(dv)
    if do.numel():
        gates_bwd_kernel[(cdiv(rows, br),)](
            gates, o_cmp, o_slc, o_win, do, dgates, *((d_cmp, d_slc, d_win) if store_do else (do,) * 3),
            delta if with_delta else dgates, rows, DV=dv, BR=br, BD=bd, DELTA=with_delta, STORE_DO=store_do,
            **LAUNCH_OPTIONS)
    return dgates, d_cmp, d_slc, d_win, delta


class GatesFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gates, o_cmp, o_slc, o_win):
        gates, o_cmp, o_slc, o_win = (x.contiguous() for x in (gates, o_cmp, o_slc, o_win))
        ctx.save_for_backward(gates, o_cmp, o_slc, o_win)
        return gates_fwd(gates, o_cmp, o_slc, o_win)

    @staticmethod
    def backward(ctx, do):
        return gates_bwd(*ctx.saved_tensors, do.contiguous())[:4]


def combine_branches(gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, o_win: torch.Tensor) -> torch.Tensor:
    """``g_cmp*o_cmp + g_slc*o_slc + g_win*o_win`` with gates ``[B, T, HQ, 3]``; same
    signature as the reference, differentiable in every input."""
    return GatesFunction.apply(gates, o_cmp, o_slc, o_win)
