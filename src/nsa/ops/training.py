"""The Triton training path of :func:`nsa.nsa_attention` as one autograd Function.

Composed from the ops' own Functions, a training step's backward pays for work that
only exists because the branches do not know about each other:

- the gates' backward writes each branch's ``do_branch = g_branch * do``: three tensors of
  ``[B, T, HQ, Dv]`` written once and read back by the branch's kernels;
- each branch recomputes ``delta = rowsum(o_branch * do_branch)``, reading two such tensors
  again, while the gates' backward already holds both in registers (it reads ``o_branch``
  for the gates' gradient);
- autograd adds the branches' ``dq`` (each ``[B, T, HQ, Dk]``) in two more passes;
- forward, the gated sum reads the three branch outputs back from memory.

Here the gates' backward writes only ``dgates`` and the three deltas. The branches' kernels
read ``do`` itself and scale their probabilities by their gate instead: ``dV = (g P)^T do``,
``dS = g P * (do V^T - rowsum(o * do))`` (``nsa.ops._triton.attention``), so ``do`` keeps
its plain, pipelined loads and each delta is the gates' gradient row sum, already at hand.
The gradients equal the composed path's up to rounding (``g * do`` is never rounded to
16 bits here). The compressed branch writes ``dq``, and the selected and window ``dQ`` kernels add their
share as they store it. Forward, the kernel that runs last writes the gated sum beside its own
output: the selected kernel where the window kernels also compute the selected branch's forced
blocks (``window_fwd_forced``; backward, their dQ share and the local blocks' dK/dV share; see
:func:`nsa.ops.window.kernel.forced_in_window`), else the window kernel (``window_fwd_summed``).
Every kernel is the ops' own, specialised by constexprs. Where the window and the
selected branch share ``(k, v)``, the window's dK/dV kernel adds its gradients to the
selected branch's as it stores them (and, with the forced blocks in the window, the local
blocks' share of the selected branch's too).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from nsa.config import NSAConfig
from nsa.ops import _guards
from nsa.ops._triton.compressed_fwd import compressed_fwd
from nsa.ops.compressed.kernel import compressed_bwd
from nsa.ops.gates.kernel import gates_bwd
from nsa.ops.selected.kernel import selected_bwd, selected_fwd, selected_fwd_summed
from nsa.ops.window.kernel import forced_in_window, window_bwd, window_fwd_forced, window_fwd_summed


Residuals = Tuple[torch.Tensor, ...]  # (o_cmp, lse_cmp, o_slc, lse_slc, o_win, lse_win)


def training_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
    gates: torch.Tensor, k_win: Optional[torch.Tensor], v_win: Optional[torch.Tensor], config: NSAConfig,
    q_offset: int,
) -> Tuple[torch.Tensor, torch.Tensor, Residuals]:
    """``(o, block_idx, residuals)``: the forward of the three branches and their gated sum, and
    what :func:`training_backward` needs of it: each branch's output (q's dtype,
    ``[B, T, HQ, Dv]``) and float32 lse (``[B, T, HQ]``). Inputs contiguous, checked;
    ``k_win``/``v_win`` None: the window reads ``(k, v)``."""
    shared = k_win is None
    kw, vw = (k, v) if shared else (k_win, v_win)
    scale = config.softmax_scale(q.shape[-1])
    forced = (config.init_blocks, config.local_blocks)
    o_cmp, lse_cmp, block_idx = compressed_fwd(q, k_cmp, v_cmp, config, scale, q_offset, select=True)
    if _forced_in_window(config, q, k, shared, q_offset):
        # the window first: it also leaves the selected branch's result over the forced blocks,
        # and the selected kernel, starting from it, sums the branches
        o_win, lse_win, o_frc, lse_frc = window_fwd_forced(q, k, v, config, scale, q_offset)
        o, o_slc, lse_slc = selected_fwd_summed(q, k, v, block_idx, config.sel_block, scale, q_offset, gates,
                                                o_cmp, o_win, forced=forced, start=(o_frc, lse_frc))
    else:
        o_slc, lse_slc = selected_fwd(q, k, v, block_idx, config.sel_block, scale, q_offset, forced=forced)
        # the window kernel also sums the branches: no separate pass over the three outputs
        o, o_win, lse_win = window_fwd_summed(q, kw, vw, config.window, scale, q_offset, gates, o_cmp, o_slc)
    return o, block_idx, (o_cmp, lse_cmp, o_slc, lse_slc, o_win, lse_win)


def training_backward(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cmp: torch.Tensor,
    v_cmp: torch.Tensor, gates: torch.Tensor, k_win: Optional[torch.Tensor], v_win: Optional[torch.Tensor],
    block_idx: torch.Tensor, residuals: Residuals, config: NSAConfig, q_offset: int, attention: bool,
) -> Tuple[Optional[torch.Tensor], ...]:
    """The gradients ``(dq, dk, dv, dk_cmp, dv_cmp, dgates, dk_win, dv_win)`` of
    :func:`training_forward`'s ``o`` for ``do``; with ``attention`` False only ``dgates``
    (the others None), and ``dk_win``/``dv_win`` None where the window reads ``(k, v)``."""
    o_cmp, lse_cmp, o_slc, lse_slc, o_win, lse_win = residuals
    shared = k_win is None
    kw, vw = (k, v) if shared else (k_win, v_win)
    scale = config.softmax_scale(q.shape[-1])
    do = do.contiguous()
    dgates, _, _, _, delta = gates_bwd(gates, o_cmp, o_slc, o_win, do, with_delta=attention, store_do=False)
    if not attention:
        return None, None, None, None, None, dgates, None, None
    # each branch's do is gates[..., i] * do: its kernels take do and the gate (one float32
    # row per branch, unit stride so that they load it beside lse in their pipelined steps)
    gate = torch.empty(3, *gates.shape[:-1], dtype=torch.float32, device=gates.device)
    gate.copy_(gates.permute(3, 0, 1, 2))  # one pass: [3, B, T, HQ]
    dq, dk_cmp, dv_cmp = compressed_bwd(q, k_cmp, v_cmp, o_cmp, lse_cmp, do, None, config, scale, q_offset,
                                        delta=delta[0], gate=gate[0])
    # with the forced blocks' forward in the window kernel, their share of dq (and the local
    # blocks' of dk/dv) is the window backward's too
    in_window = _forced_in_window(config, q, k, shared, q_offset)
    forced = (config.init_blocks, config.local_blocks)
    _, dk, dv = selected_bwd(q, k, v, block_idx, o_slc, lse_slc, do, config.sel_block, scale, q_offset,
                             forced=forced, delta=delta[1], dq=dq, gate=gate[1], forced_done=in_window)
    # with shared (k, v), the window's dK/dV kernel adds its share to the selected branch's
    _, dk_win, dv_win = window_bwd(
        q, kw, vw, o_win, lse_win, do, config.window, scale, q_offset, delta=delta[2], dq=dq, gate=gate[2],
        forced=dict(config=config, lse=lse_slc, delta=delta[1], gate=gate[1]) if in_window else None,
        dkv=(dk, dv) if shared else None)
    if shared:
        dk_win = dv_win = None
    return dq, dk, dv, dk_cmp, dv_cmp, dgates, dk_win, dv_win


def _forced_in_window(config: NSAConfig, q: torch.Tensor, k: torch.Tensor, shared: bool, q_offset: int) -> bool:
    """Whether the window kernels also compute the selected branch's forced blocks: only where
    both branches read ``(k, v)`` (:func:`nsa.ops.window.kernel.forced_in_window`)."""
    return shared and forced_in_window(config, q.shape[2] // k.shape[2], q_offset)


class NSATrainingFunction(torch.autograd.Function):
    """``(o, block_idx)`` of the three branches and their gated sum; ``block_idx`` is not
    differentiable. ``k_win``/``v_win`` None: the window reads ``(k, v)``."""

    @staticmethod
    def forward(ctx, q, k, v, k_cmp, v_cmp, gates, k_win, v_win, config: NSAConfig, q_offset: int):
        o, block_idx, residuals = training_forward(q, k, v, k_cmp, v_cmp, gates, k_win, v_win, config, q_offset)
        ctx.save_for_backward(q, k, v, k_cmp, v_cmp, gates, k_win, v_win, block_idx, *residuals)
        ctx.config, ctx.q_offset = config, q_offset
        ctx.mark_non_differentiable(block_idx)
        ctx.set_materialize_grads(False)
        return o, block_idx

    @staticmethod
    def backward(ctx, do, _):
        if do is None:
            return (None,) * 10
        q, k, v, k_cmp, v_cmp, gates, k_win, v_win, block_idx, *residuals = ctx.saved_tensors
        # the branches' backwards only when a tensor other than the gates needs a gradient
        attention = any(ctx.needs_input_grad[i] for i in (0, 1, 2, 3, 4, 6, 7))
        grads = training_backward(do, q, k, v, k_cmp, v_cmp, gates, k_win, v_win, block_idx, tuple(residuals),
                                  ctx.config, ctx.q_offset, attention)
        return (*grads, None, None)


def nsa_attention_training(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, k_cmp: torch.Tensor,
    v_cmp: torch.Tensor, k_win: Optional[torch.Tensor], v_win: Optional[torch.Tensor], config: NSAConfig,
    q_offset: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(o, block_idx)`` of :func:`nsa.nsa_attention` on Triton, differentiable in every
    tensor but ``block_idx``; ``k_win``/``v_win`` None when the window reads ``(k, v)``.
    The caller has checked ``q``, ``k``, ``v``, ``gates`` and the config."""
    q, k, v, gates, k_cmp, v_cmp, k_win, v_win = prepared(q, k, v, gates, k_cmp, v_cmp, k_win, v_win, q_offset)
    return NSATrainingFunction.apply(q, k, v, k_cmp, v_cmp, gates, k_win, v_win, config, q_offset)


def prepared(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, k_cmp: torch.Tensor,
    v_cmp: torch.Tensor, k_win: Optional[torch.Tensor], v_win: Optional[torch.Tensor], q_offset: int,
) -> Tuple[Optional[torch.Tensor], ...]:
    """The training path's inputs checked (the compressed pair, the offset against each branch's
    keys) and contiguous, in the order given."""
    _guards.check_attention_inputs(q, k_cmp, v_cmp, ("q", "k_cmp", "v_cmp"))
    _guards.check_q_offset(q_offset, q, k.shape[1])
    if k_win is not None:
        _guards.check_q_offset(q_offset, q, k_win.shape[1])
    return tuple(x.contiguous() if x is not None else None for x in (q, k, v, gates, k_cmp, v_cmp, k_win, v_win))
