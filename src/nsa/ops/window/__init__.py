"""Sliding-window branch (spec: "Sliding branch")."""

from __future__ import annotations

from typing import Optional

import torch

from nsa.config import NSAConfig
from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op


@public_op
def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    config: NSAConfig,
    *,
    q_offset: int = 0,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """Causal attention over the last ``config.window`` positions, the query's own included.

    Query ``i`` at position ``t = q_offset + i`` sees keys ``s`` with ``t - w < s <= t``.

    Args:
        q: ``[B, Tq, HQ, Dk]``.
        k: ``[B, Tk, H, Dk]``, ``Tk >= q_offset + Tq`` (later positions are never read).
        v: ``[B, Tk, H, Dv]``.
        config: ``window`` and scale.
        q_offset: position of the first query.
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"``.

    Returns:
        ``[B, Tq, HQ, Dv]`` in q's dtype.
    """
    _guards.check_config(config)
    _guards.check_attention_inputs(q, k, v)
    _guards.check_q_offset(q_offset, q, k.shape[1])
    scale = config.softmax_scale(q.shape[-1])
    fn = implementation("window", "sliding_window_attention", q, backend, (q.shape[-1], v.shape[-1]))
    return fn(q, k, v, config, scale, q_offset)
