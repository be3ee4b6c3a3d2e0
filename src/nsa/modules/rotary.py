"""Rotary position embedding (rotate-half form) at absolute positions."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

from nsa.ops import apply_rotary, rope_tables

#: ``(cos, sin)``, each ``[(B,) T, 1, D/2]`` in the dtype of the tensors they rotate.
Tables = Tuple[torch.Tensor, torch.Tensor]


class RotaryEmbedding(nn.Module):
    """Applies RoPE to ``[B, T, heads, D]`` tensors given their absolute positions.

    Angles are float64 whatever the module's dtype. The frequencies are no buffer: kept per
    device outside the module's state, ``layer.to(torch.bfloat16)`` cannot round them (a
    bfloat16 buffer once made positions past 256 collide: 1001 rounded to 1000), and a layer
    made on the ``meta`` device computes them on its first call. Several tensors at the same
    positions share one :meth:`tables` (a layer rotates its queries and three branches' keys).

    Args:
        head_dim: D (must be even).
        theta: base of the frequencies (default 10000).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim, self.theta = head_dim, float(theta)
        self._inv_freq: Dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """The ``D/2`` frequencies, float64 on ``device``; made once a device, but never kept
        from inside a CUDA graph capture (whose kernels have not run when it returns). Traced
        graphs never ask: there :meth:`tables` is one op that computes its own."""
        freqs = self._inv_freq.get(device)
        if freqs is None:
            freqs = _frequencies(self.head_dim, self.theta, device)
            if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
                self._inv_freq[device] = freqs
        return freqs

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> Tables:
        """``(cos, sin)`` at ``positions [T]`` (or ``[B, T]``, absolute token indices), in ``dtype``."""
        if torch.compiler.is_compiling():
            # one opaque node: Inductor fused the float64 cos/sin into every rotated element
            # instead (64 query heads: 3.4 of 11.2 ms of a 16k forward, H200)
            return tuple(torch.ops.nsa.rope_tables(positions, self.head_dim, self.theta, dtype))
        return rope_tables(positions, self.inv_freq(positions.device), dtype)

    @staticmethod
    def rotate(x: torch.Tensor, tables: Tables) -> torch.Tensor:
        """``x [B, T, heads, D]`` rotated by :meth:`tables` (:func:`nsa.ops.apply_rotary`: one
        Triton pass on CUDA)."""
        return apply_rotary(x, *tables)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x [B, T, heads, D]``; ``positions [T]`` (or ``[B, T]``) are absolute token indices."""
        return self.rotate(x, self.tables(positions.to(x.device), x.dtype))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}"


def _frequencies(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)


@torch.library.custom_op("nsa::rope_tables", mutates_args=())
def _rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> List[torch.Tensor]:
    """:meth:`RotaryEmbedding.tables` where a graph is traced (no gradient: positions are indices)."""
    return list(rope_tables(positions, _frequencies(head_dim, theta, positions.device), dtype))


@_rope_tables.register_fake
def _(positions, head_dim, theta, dtype):
    shape = (*positions.shape, 1, head_dim // 2)
    return [positions.new_empty(shape, dtype=dtype) for _ in range(2)]
