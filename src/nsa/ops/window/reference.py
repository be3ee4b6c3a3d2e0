"""Sliding-window attention: the reference definition."""

from __future__ import annotations

import torch

from nsa.config import NSAConfig
from nsa.ops._reference import compute_dtype, dense_attention, map_query_chunks


def sliding_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> torch.Tensor:
    """``[B, Tq, HQ, Dv]``: query ``t`` attends to positions ``t - w < s <= t``."""
    B, Tq, HQ, _ = q.shape
    w = config.window
    ct = compute_dtype(q.dtype)
    qc, kc, vc = q.to(ct), k.to(ct), v.to(ct)

    def chunk(start: int, end: int) -> torch.Tensor:
        first, last = q_offset + start, q_offset + end - 1  # positions of the chunk's queries
        lo = max(0, first - w + 1)
        s = torch.arange(lo, last + 1, device=q.device)[None, :]
        t = torch.arange(first, last + 1, device=q.device)[:, None]
        visible = (s <= t) & (s > t - w)
        return dense_attention(qc[:, start:end], kc[:, lo : last + 1], vc[:, lo : last + 1], visible, scale)[0]

    # A chunk of C queries scores C + w - 1 keys a query: chunks of at most w queries keep that
    # under 2w (what the budget counts) and the masked square's work within twice the band's.
    return torch.cat(map_query_chunks(chunk, Tq, B * HQ * 2 * w, most=w), dim=1).to(q.dtype)
