"""Attention over the positions of selected blocks: the reference definition."""

from __future__ import annotations

import torch

from nsa.config import NSAConfig
from nsa.ops._reference import compute_dtype, map_query_chunks, masked_softmax, split_groups


def gather_positions(block_idx: torch.Tensor, sel_block: int):
    """Positions covered by each block list, and which of them count.

    Args:
        block_idx: ``[..., m]`` block indices, -1 for none; order and repeats allowed.

    Returns:
        ``(positions [..., m*sel_block] int64, counted [..., m*sel_block] bool)``:
        a repeated block counts once, -1 never.
    """
    idx = block_idx.to(torch.int64).sort(dim=-1).values
    repeated = torch.zeros_like(idx, dtype=torch.bool)
    repeated[..., 1:] = idx[..., 1:] == idx[..., :-1]
    counted = (idx >= 0) & ~repeated
    offsets = torch.arange(sel_block, device=idx.device)
    positions = idx[..., None] * sel_block + offsets  # [..., m, sel_block]
    counted = counted[..., None].expand_as(positions)
    return positions.flatten(-2), counted.flatten(-2)


def selected_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    config: NSAConfig,
    scale: float,
    q_offset: int,
) -> torch.Tensor:
    """``[B, Tq, HQ, Dv]``: attention over selected positions ``s <= t``."""
    B, Tq, HQ, _ = q.shape
    Tk, H = k.shape[1], k.shape[2]
    ct = compute_dtype(q.dtype)
    qg = split_groups(q.to(ct), H)
    k_heads, v_heads = k.to(ct).transpose(1, 2), v.to(ct).transpose(1, 2)  # [B, H, Tk, D]
    per_key = block_idx.shape[-1] * config.sel_block
    b_ix = torch.arange(B, device=q.device)[:, None, None, None]
    h_ix = torch.arange(H, device=q.device)[None, None, :, None]

    def chunk(start: int, end: int) -> torch.Tensor:
        positions, counted = gather_positions(block_idx[:, start:end], config.sel_block)  # [B, C, H, S]
        t = torch.arange(q_offset + start, q_offset + end, device=q.device)[None, :, None, None]
        counted = counted & (positions <= t) & (positions < Tk)
        # Masked slots read position 0, never s > t: a cache buffer's unwritten tail may hold
        # NaN, and a zero probability times NaN would still poison the row.
        positions = torch.where(counted, positions, torch.zeros_like(positions))
        k_sel = k_heads[b_ix, h_ix, positions]  # [B, C, H, S, Dk]
        v_sel = v_heads[b_ix, h_ix, positions]  # [B, C, H, S, Dv]
        scores = torch.einsum("bchgd,bchsd->bchgs", qg[:, start:end], k_sel) * scale
        probs, _ = masked_softmax(scores, counted[:, :, :, None, :])
        return torch.einsum("bchgs,bchsv->bchgv", probs, v_sel).flatten(2, 3)

    outs = map_query_chunks(chunk, Tq, B * H * per_key * (HQ // H + k.shape[-1] + v.shape[-1]))
    return torch.cat(outs, dim=1).to(q.dtype)
