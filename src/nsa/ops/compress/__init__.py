"""Compression of raw keys/values into compressed tokens (spec: "Compressed branch")."""

from __future__ import annotations

from typing import Optional

import torch

from nsa.config import NSAConfig
from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op


@public_op
def mean_compress(x: torch.Tensor, config: NSAConfig, *, backend: Optional[str] = None) -> torch.Tensor:
    """Mean-pool raw tokens into compressed tokens (the parameter-free phi).

    Compressed token ``i`` is the mean of ``x[:, i*d : i*d + l]`` (``l = cmp_block``,
    ``d = cmp_stride``); only complete blocks are emitted.

    Args:
        x: ``[B, T, H, D]`` keys or values, any float dtype.
        config: block geometry.
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"`` (see :mod:`nsa.routing`).

    Returns:
        ``[B, Nc, H, D]`` in ``x``'s dtype, ``Nc = 0 if T < l else (T - l) // d + 1``.
    """
    _guards.check_config(config)
    _guards.check_tensor("x", x)
    return implementation("compress", "mean_compress", x, backend)(x, config)
