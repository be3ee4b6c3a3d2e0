"""Decode through the reference ops: decode == prefill by construction.

Each sequence ``b`` of the batch is one call of the prefill reference ops with
``q_offset = seq_lens[b] - Tq`` over its cache slices, so a decode step computes
exactly what a prefill of the whole sequence computes for its last ``Tq`` queries.
Reading ``seq_lens`` on the host syncs: this path is the definition, not the
graph-capturable one.
"""

from __future__ import annotations

from typing import Tuple, Union

import torch

from nsa.config import NSAConfig
from nsa.ops.gates.projection import GateProjection
from nsa.ops.gates.reference import combine_branches
from nsa.ops.compressed.reference import compressed_attention
from nsa.ops.select.reference import select_blocks
from nsa.ops.selected.reference import selected_attention
from nsa.ops.window.reference import sliding_window_attention


def nsa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: Union[torch.Tensor, GateProjection],
    seq_lens: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    config: NSAConfig,
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(o [B, Tq, HQ, Dv], block_idx [B, Tq, H, sel_count] int32)`` of the last ``Tq`` queries.
    ``gates`` may be a :class:`~nsa.ops.gates.projection.GateProjection`: evaluated first."""
    B, Tq, HQ, _ = q.shape
    if isinstance(gates, GateProjection):
        gates = gates.evaluate(HQ)
    H = k.shape[2]
    o = q.new_zeros(B, Tq, HQ, v.shape[-1])
    block_idx = torch.full((B, Tq, H, config.sel_count), -1, dtype=torch.int32, device=q.device)
    for b, length in enumerate(seq_lens.tolist()):
        offset, nc = length - Tq, config.num_cmp(length)
        one = slice(b, b + 1)
        qb = q[one]
        o_cmp, _ = compressed_attention(qb, k_cmp[one, :nc], v_cmp[one, :nc], config, scale, offset)
        idx = select_blocks(qb, k_cmp[one, :nc], config, scale, offset)
        o_slc = selected_attention(qb, k[one, :length], v[one, :length], idx, config, scale, offset)
        o_win = sliding_window_attention(qb, k_win[one, :length], v_win[one, :length], config, scale, offset)
        o[one] = combine_branches(gates[one], o_cmp, o_slc, o_win)
        block_idx[one] = idx
    return o, block_idx
