"""Rotary position embedding (rotate-half form): the reference definitions."""

from __future__ import annotations

from typing import Tuple

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [B, T, heads, D]`` with halves ``(x1, x2)`` -> ``(x1 cos - x2 sin, x1 sin + x2 cos)``;
    ``cos``/``sin`` ``[(B,) T, 1, D/2]`` in ``x``'s dtype, each product rounded to it."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of the angles ``positions * inv_freq``, computed in float64 and rounded to
    ``dtype``: each ``[*positions.shape, 1, D/2]``."""
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [(B,) T, D/2]
    return angles.cos().to(dtype).unsqueeze(-2), angles.sin().to(dtype).unsqueeze(-2)
