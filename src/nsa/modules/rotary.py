"""Rotary position embedding (rotate-half form) at absolute positions."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Applies RoPE to ``[B, T, heads, D]`` tensors given their absolute positions.

    Args:
        head_dim: D (must be even).
        theta: base of the frequencies (default 10000).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [B, T, heads, D]``; ``positions [T]`` (or ``[B, T]``) are absolute token indices."""
        angles = positions.to(self.inv_freq.dtype)[..., None] * self.inv_freq  # [(B,) T, D/2]
        cos = angles.cos().to(x.dtype).unsqueeze(-2)  # [(B,) T, 1, D/2]
        sin = angles.sin().to(x.dtype).unsqueeze(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
