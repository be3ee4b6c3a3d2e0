"""Rotary position embedding (rotate-half form): the reference definition."""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, T, heads, D]`` with halves ``(x1, x2)`` -> ``(x1 cos - x2 sin, x1 sin + x2 cos)``;
    ``cos``/``sin`` ``[(B,) T, 1, D/2]`` in ``x``'s dtype, each product rounded to it."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
