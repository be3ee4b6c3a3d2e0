"""Rotary position embedding, rotate-half form (how :class:`nsa.NSAAttention` places its queries and
keys)."""

from __future__ import annotations

from typing import Optional

import torch

from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op


@public_op
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                 backend: Optional[str] = None) -> torch.Tensor:
    """Rotate ``x``'s halves ``(x1, x2)`` to ``(x1 cos - x2 sin, x1 sin + x2 cos)``.

    Args:
        x: ``[B, T, heads, D]``, D even, any float dtype.
        cos, sin: ``[T, 1, D/2]`` (every sequence at the same positions) or ``[B, T, 1, D/2]``, in
            ``x``'s dtype and on its device (:meth:`nsa.modules.RotaryEmbedding.tables`).
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"`` (flag ``NSA_BACKEND_ROTARY``).

    Returns:
        ``[B, T, heads, D]`` in ``x``'s dtype, differentiable in ``x`` (not in the tables).
    """
    _guards.check_tensor("x", x)
    B, T, _, D = x.shape
    if D % 2:
        raise ValueError(f"x must have an even last dimension (two halves), got {list(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        _guards.check_tensor(name, t, rank=4 if isinstance(t, torch.Tensor) and t.dim() == 4 else 3)  # either form
        _guards.check_same(("x", name), (x, t))
        want = ([B] if t.dim() == 4 else []) + [T, 1, D // 2]
        if list(t.shape) != want:
            raise ValueError(f"{name} must have shape [(B,) T, 1, D/2] = {want}, got {list(t.shape)}")
    return implementation("rotary", "apply_rotary", x, backend, D)(x, cos, sin)
