"""Mean pooling of raw tokens into compressed tokens: the reference definition."""

from __future__ import annotations

import torch

from nsa.config import NSAConfig
from nsa.ops._reference import compute_dtype


def mean_compress(x: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    """``[B, T, H, D] -> [B, Nc, H, D]``; token ``i`` is the mean of ``x[:, i*d : i*d+l]``."""
    B, T, H, D = x.shape
    num = config.num_cmp(T)
    if num == 0:
        return x.new_empty(B, 0, H, D)
    used = (num - 1) * config.cmp_stride + config.cmp_block
    windows = x[:, :used].to(compute_dtype(x.dtype)).unfold(1, config.cmp_block, config.cmp_stride)
    return windows.mean(dim=-1).to(x.dtype)  # [B, Nc, H, D]
