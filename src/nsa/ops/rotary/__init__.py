"""Rotary position embedding, rotate-half form (how :class:`nsa.NSAAttention` places its queries and
keys)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op, route


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


@public_op
def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, *,
                backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``(cos, sin)`` tables that :func:`apply_rotary` takes: the angles ``positions * inv_freq``
    in float64, their cosines and sines rounded to ``dtype``.

    Args:
        positions: integer ``[T]`` or ``[B, T]`` (absolute token indices).
        inv_freq: float64 ``[D/2]`` frequencies, on ``positions``' device
            (:meth:`nsa.modules.RotaryEmbedding.inv_freq`).
        dtype: of the tables (that of the tensors they rotate).
        backend: as :func:`apply_rotary`'s (routed for ``dtype``).

    Returns:
        ``cos, sin``, each ``[*positions.shape, 1, D/2]``.
    """
    if not isinstance(positions, torch.Tensor) or positions.dim() not in (1, 2):
        raise ValueError(f"positions must be a [T] or [B, T] tensor, got {getattr(positions, 'shape', type(positions))}")
    _guards.check_tensor("positions", positions, rank=positions.dim(), floating=False)
    _guards.check_tensor("inv_freq", inv_freq, rank=1)
    if inv_freq.dtype != torch.float64:
        raise TypeError(f"inv_freq must be float64, got {inv_freq.dtype}")
    _guards.check_same(("positions", "inv_freq"), (positions, inv_freq), dtype=False)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype}")
    tables = route("rotary", "rope_tables", positions.device, dtype, backend, 2 * inv_freq.shape[0])
    return tables(positions, inv_freq, dtype)
