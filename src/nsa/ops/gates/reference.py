"""Gated sum of the branches: PyTorch reference."""

from __future__ import annotations

import torch


def combine_branches(gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, o_win: torch.Tensor) -> torch.Tensor:
    """``g_cmp*o_cmp + g_slc*o_slc + g_win*o_win`` with gates ``[B, T, HQ, 3]``."""
    g = gates.to(o_cmp.dtype)
    return g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win
