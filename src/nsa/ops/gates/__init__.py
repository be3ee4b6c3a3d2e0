"""Gated sum of the three branches (spec: "Gates and output")."""

from __future__ import annotations

from typing import Optional

import torch

from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op


@public_op
def combine_branches(
    gates: torch.Tensor,
    o_cmp: torch.Tensor,
    o_slc: torch.Tensor,
    o_win: torch.Tensor,
    *,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """``g_cmp * o_cmp + g_slc * o_slc + g_win * o_win``.

    Args:
        gates: ``[B, T, HQ, 3]`` in the order (cmp, slc, win), any float dtype.
        o_cmp, o_slc, o_win: ``[B, T, HQ, Dv]`` branch outputs, one dtype.
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"``.

    Returns:
        ``[B, T, HQ, Dv]`` in the branches' dtype, differentiable in every input.
    """
    _guards.check_tensor("o_cmp", o_cmp)
    _guards.check_gates(gates, o_cmp)
    for name, o in (("o_slc", o_slc), ("o_win", o_win)):
        _guards.check_tensor(name, o)
        if o.shape != o_cmp.shape or o.dtype != o_cmp.dtype or o.device != o_cmp.device:
            raise ValueError(
                f"{name} must match o_cmp: got {tuple(o.shape)} {o.dtype} on {o.device}, "
                f"o_cmp is {tuple(o_cmp.shape)} {o_cmp.dtype} on {o_cmp.device}"
            )
    return implementation("gates", "combine_branches", o_cmp, backend)(gates, o_cmp, o_slc, o_win)
