"""Independent oracles for the identity and selection tests: float64, plain masks, no nsa code.

Layout follows the spec: q ``[B, Tq, HQ, Dk]``, k ``[B, Tk, H, Dk]``, v ``[B, Tk, H, Dv]``;
query head ``h`` reads KV head ``h // G``. Every oracle returns float64.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F

from nsa import NSAConfig


def causal_mask(
    tq: int, tk: int, q_offset: int = 0, window: Optional[int] = None, device: Optional[torch.device] = None
) -> torch.Tensor:
    """bool ``[Tq, Tk]``: query ``i`` (position ``q_offset + i``) sees ``s <= t`` (and ``s > t - window``)."""
    t = torch.arange(q_offset, q_offset + tq, device=device)[:, None]
    s = torch.arange(tk, device=device)[None, :]
    mask = s <= t
    if window is not None:
        mask &= s > t - window
    return mask


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: Optional[float] = None
) -> torch.Tensor:
    """float64 ``[B, Tq, HQ, Dv]``: softmax attention under ``mask`` (bool, broadcastable to
    ``[B, HQ, Tq, Tk]``); a row that sees no key is 0."""
    qd, kd, vd = (x.detach().double().transpose(1, 2) for x in (q, k, v))
    seen = mask.any(dim=-1, keepdim=True)
    # SDPA gives NaN for a row with no key: let such rows see everything, then zero them.
    out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask | ~seen, scale=scale, enable_gqa=True)
    return out.masked_fill(~seen, 0.0).transpose(1, 2)


def dense_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int = 0, window: Optional[int] = None
) -> torch.Tensor:
    """Dense causal (optionally sliding-window) attention, float64, default scale ``1/sqrt(Dk)``."""
    mask = causal_mask(q.shape[1], k.shape[1], q_offset, window, q.device)
    return attention(q, k, v, mask)


def mean_pool(x: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    """float64 ``[B, Nc, H, D]``: token ``i`` is the mean of ``x[:, i*d : i*d + l]`` (a loop over ``i``)."""
    l, d = config.cmp_block, config.cmp_stride
    tokens = [x[:, i : i + l].double().mean(dim=1) for i in range(0, x.shape[1] - l + 1, d)]
    if not tokens:
        return x.new_zeros(x.shape[0], 0, *x.shape[2:], dtype=torch.float64)
    return torch.stack(tokens, dim=1)


def cmp_visible(tq: int, num_cmp: int, config: NSAConfig, q_offset: int = 0, device=None) -> torch.Tensor:
    """bool ``[Tq, Nc]``: compressed token ``i`` is visible to ``t`` iff ``i*d + l - 1 <= t``."""
    t = torch.arange(q_offset, q_offset + tq, device=device)[:, None]
    i = torch.arange(num_cmp, device=device)[None, :]
    return i * config.cmp_stride + config.cmp_block - 1 <= t


def block_mask(block_idx: torch.Tensor, tk: int, config: NSAConfig, group: int, q_offset: int = 0) -> torch.Tensor:
    """bool ``[B, HQ, Tq, Tk]``: position ``s`` lies in a block of ``block_idx[b, i, h // G]`` and ``s <= t``."""
    blk = torch.arange(tk, device=block_idx.device) // config.sel_block  # [Tk]
    hit = (block_idx.long()[..., None] == blk).any(dim=-2)  # [B, Tq, H, Tk]
    hit = hit.repeat_interleave(group, dim=2).transpose(1, 2)  # [B, HQ, Tq, Tk]
    return hit & causal_mask(block_idx.shape[1], tk, q_offset, device=block_idx.device)


def spec_block_scores(q_row: torch.Tensor, k_cmp: torch.Tensor, t: int, config: NSAConfig) -> List[float]:
    """Group score of every visible block for one query position ``t``, straight from the spec.

    Args:
        q_row: ``[G, Dk]`` the group's query heads at position ``t``.
        k_cmp: ``[Nc, Dk]`` the group's compressed keys.

    Returns:
        ``score[j]`` for ``j = 0 .. t // l'``: ``sum_h sum_i p_cmp[h, i] * |overlap(i, j)| / l``.
    """
    l, d, lb = config.cmp_block, config.cmp_stride, config.sel_block
    scale = config.softmax_scale(q_row.shape[-1])
    visible = [i for i in range(k_cmp.shape[0]) if i * d + l - 1 <= t]
    scores = [0.0] * (t // lb + 1)
    if not visible:
        return scores
    logits = scale * (q_row.double() @ k_cmp[visible].double().T)  # [G, |visible|]
    probs = torch.softmax(logits, dim=-1).tolist()
    for p_head in probs:
        for p, i in zip(p_head, visible):
            for j in range(len(scores)):
                overlap = min(i * d + l, (j + 1) * lb) - max(i * d, j * lb)
                if overlap > 0:
                    scores[j] += p * overlap / l
    return scores


def spec_top_n(scores: List[float], t: int, config: NSAConfig) -> List[int]:
    """Eq. 11 as the spec words it: blocks chosen for position ``t``, ascending, padded with -1."""
    n, own = config.sel_count, t // config.sel_block
    visible = list(range(own + 1))
    if len(visible) <= n:
        chosen = visible
    else:
        forced = {j for j in visible if j < config.init_blocks or j > own - config.local_blocks}
        rest = sorted((j for j in visible if j not in forced), key=lambda j: (-scores[j], j))
        chosen = sorted(forced | set(rest[: n - len(forced)]))
    return chosen + [-1] * (n - len(chosen))
