"""Rotary position embedding (rotate-half form) at absolute positions."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Applies RoPE to ``[B, T, heads, D]`` tensors given their absolute positions.

    The angles are computed in float64 at every call, whatever the module's dtype: no buffer
    holds the frequencies, so ``layer.to(torch.bfloat16)`` cannot round them (a bfloat16
    buffer once made positions past 256 collide: 1001 rounded to 1000), and a layer made on
    the ``meta`` device needs nothing re-initialised.

    Args:
        head_dim: D (must be even).
        theta: base of the frequencies (default 10000).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim, self.theta = head_dim, float(theta)

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """The ``D/2`` frequencies, float64 on ``device``."""
        return self.theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device) / self.head_dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [B, T, heads, D]``; ``positions [T]`` (or ``[B, T]``) are absolute token indices."""
        angles = positions.to(torch.float64)[..., None] * self.inv_freq(x.device)  # [(B,) T, D/2]
        cos = angles.cos().to(x.dtype).unsqueeze(-2)  # [(B,) T, 1, D/2]
        sin = angles.sin().to(x.dtype).unsqueeze(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}"
