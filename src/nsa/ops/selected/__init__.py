"""Selected-attention branch (spec: "Selected branch")."""

from __future__ import annotations

from typing import Optional

import torch

from nsa.config import NSAConfig
from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op


@public_op
def selected_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    config: NSAConfig,
    *,
    q_offset: int = 0,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """Attention of each query over the positions of its group's selected blocks.

    Query ``i`` (position ``t = q_offset + i``) attends to every position ``s``
    of a block in ``block_idx[:, i, h // G]`` with ``s <= t``. Entries -1 are
    ignored and a repeated block counts once. All query heads of a KV group use
    that group's blocks.

    Args:
        q: ``[B, Tq, HQ, Dk]``.
        k: ``[B, Tk, H, Dk]`` raw keys, ``Tk >= q_offset + Tq``; positions past
            the last query are never read (so a cache buffer may be passed whole).
        v: ``[B, Tk, H, Dv]``.
        block_idx: int32/int64 ``[B, Tq, H, m]``, values in ``[-1, ceil(Tk / sel_block))``
            (checked on CPU; on CUDA only with ``NSA_CHECK_INDICES=on``).
        config: block geometry and scale.
        q_offset: position of the first query.
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"``.

    Returns:
        ``[B, Tq, HQ, Dv]`` in q's dtype.
    """
    _guards.check_config(config)
    _guards.check_attention_inputs(q, k, v)
    _guards.check_q_offset(q_offset, q, k.shape[1])
    _guards.check_block_idx(block_idx, q, k, config)
    scale = config.softmax_scale(q.shape[-1])
    fn = implementation("selected", "selected_attention", q, backend, (q.shape[-1], v.shape[-1]))
    return fn(q, k, v, block_idx, config, scale, q_offset)
