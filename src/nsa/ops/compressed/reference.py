"""Attention over compressed tokens: the reference definition."""

from __future__ import annotations

from typing import Tuple

import torch

from nsa.config import NSAConfig
from nsa.ops._reference import compute_dtype, dense_attention, map_query_chunks


def visible_cmp_count(positions: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    """``Nc(t)`` of the spec for each query position (0 where ``t + 1 < cmp_block``)."""
    count = torch.div(positions + 1 - config.cmp_block, config.cmp_stride, rounding_mode="floor") + 1
    return count.clamp_min(0)


def compressed_attention(
    q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``o [B, Tq, HQ, Dv]`` (q's dtype) and ``lse [B, Tq, HQ]`` over visible compressed tokens."""
    B, Tq, HQ, _ = q.shape
    Nc = k_cmp.shape[1]
    ct = compute_dtype(q.dtype)
    qc, kc, vc = q.to(ct), k_cmp.to(ct), v_cmp.to(ct)

    def chunk(start: int, end: int) -> Tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(q_offset + start, q_offset + end, device=q.device)
        counts = visible_cmp_count(positions, config)
        span = min(Nc, config.num_cmp(q_offset + end))  # compressed tokens any query here can see
        visible = torch.arange(span, device=q.device)[None, :] < counts[:, None]  # [C, span]
        return dense_attention(qc[:, start:end], kc[:, :span], vc[:, :span], visible, scale)

    outs, lses = zip(*map_query_chunks(chunk, Tq, B * HQ * max(Nc, 1)))
    return torch.cat(outs, 1).to(q.dtype), torch.cat(lses, 1)
