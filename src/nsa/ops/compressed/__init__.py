"""Compressed-attention branch (spec: "Compressed branch")."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from nsa.config import NSAConfig
from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op


@public_op
def compressed_attention(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    config: NSAConfig,
    *,
    q_offset: int = 0,
    backend: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of each query over the compressed tokens it can see.

    Query ``i`` sits at position ``t = q_offset + i`` and sees compressed token ``j``
    iff ``j*d + l - 1 <= t`` (the token's whole block lies in its past)::

        t:       0 ... l-2   l-1   ...  l-1+d  ...
        visible: none        j=0        j<=1

    A query that sees nothing (``t < l - 1``) gets ``o = 0`` and ``lse = -inf``;
    it never produces NaN, forward or backward.

    Args:
        q: ``[B, Tq, HQ, Dk]``.
        k_cmp: ``[B, Nc, H, Dk]`` compressed keys, ``H | HQ``.
        v_cmp: ``[B, Nc, H, Dv]`` compressed values.
        config: block geometry and scale (default ``1/sqrt(Dk)``).
        q_offset: position of the first query (0 for a prefill; the cache length in decode).
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"``.

    Returns:
        ``(o, lse)``: ``o [B, Tq, HQ, Dv]`` in q's dtype; ``lse [B, Tq, HQ]``
        (natural log) in float32, or float64 for float64 inputs.
    """
    _guards.check_config(config)
    _guards.check_attention_inputs(q, k_cmp, v_cmp, ("q", "k_cmp", "v_cmp"))
    _guards.check_q_offset(q_offset, q, None)
    scale = config.softmax_scale(q.shape[-1])
    fn = implementation("compressed", "compressed_attention", q, backend, (q.shape[-1], v_cmp.shape[-1]))
    return fn(q, k_cmp, v_cmp, config, scale, q_offset)
