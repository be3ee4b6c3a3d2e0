"""Block selection: scores from compressed attention, top-n per KV group (spec Eqs. 8-11)."""

from __future__ import annotations

from typing import Optional

import torch

from nsa.config import NSAConfig
from nsa.ops import _guards
from nsa.ops._dispatch import implementation, public_op


@public_op
def select_blocks(
    q: torch.Tensor,
    k_cmp: torch.Tensor,
    config: NSAConfig,
    *,
    q_offset: int = 0,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """Choose ``sel_count`` selection blocks per query and KV group.

    For query ``t`` and head ``h``: ``p_cmp = softmax(scale * q·k_cmp)`` over the
    visible compressed tokens only; ``p_slc[j] = sum_i p_cmp[i] * overlap(i, j) / l``
    (mass-conserving mapping of compressed tokens onto blocks of ``sel_block``);
    the heads of a group are summed. Blocks ``{0..init_blocks-1}`` and the
    ``local_blocks`` ending at ``t // sel_block`` are always chosen; the rest go
    to the highest scores, ties to the lower block index. With at most
    ``sel_count`` visible blocks, all of them are chosen.

    Args:
        q: ``[B, Tq, HQ, Dk]`` queries at positions ``q_offset ...``.
        k_cmp: ``[B, Nc, H, Dk]`` compressed keys.
        config: block geometry.
        q_offset: position of the first query.
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"``.

    Returns:
        int32 ``[B, Tq, H, sel_count]``: block indices ascending, padded with -1.
    """
    _guards.check_config(config)
    _guards.check_tensor("q", q)
    _guards.check_tensor("k_cmp", k_cmp)
    _guards.check_attention_inputs(q, k_cmp, k_cmp, ("q", "k_cmp", "k_cmp"))
    _guards.check_q_offset(q_offset, q, None)
    scale = config.softmax_scale(q.shape[-1])
    fn = implementation("select", "select_blocks", q, backend, q.shape[-1])
    return fn(q, k_cmp, config, scale, q_offset)
