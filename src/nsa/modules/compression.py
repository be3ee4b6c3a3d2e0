"""The compression function phi: raw key/value blocks -> compressed tokens.

``MLPCompression`` is the learnable phi of the paper (Eq. 7): an MLP over the
flattened block of ``cmp_block`` tokens plus an intra-block position embedding,
shared by all KV heads. ``MeanCompression`` is the parameter-free mean pooling
(it goes through :func:`nsa.ops.mean_compress`, so it uses the Triton kernel on CUDA).

Both compute the compressed tokens ``[first, first + count)`` from the raw
tokens, which is what the cache needs to emit new tokens during decode.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from nsa.config import NSAConfig
from nsa.ops import mean_compress
from nsa.ops.decode.mlp_weights import MLPWeights


def _token_span(config: NSAConfig, first: int, count: int) -> slice:
    """Raw positions that compressed tokens ``[first, first + count)`` cover."""
    start = first * config.cmp_stride
    return slice(start, start + (count - 1) * config.cmp_stride + config.cmp_block)


class MeanCompression(nn.Module):
    """Parameter-free phi: the mean of each block (``backend`` as :func:`nsa.ops.mean_compress`'s)."""

    def __init__(self, config: NSAConfig, backend: Optional[str] = None) -> None:
        super().__init__()
        self.config, self.backend = config, backend

    def forward(self, x: torch.Tensor, first: int = 0, count: Optional[int] = None) -> torch.Tensor:
        """``x [B, T, H, D]`` -> compressed tokens ``[first, first+count)`` as ``[B, count, H, D]``.

        ``count`` defaults to every complete token from ``first`` on.
        """
        if first == 0 and count is None:
            # all of x, unsliced: a graph traced for any length (torch.export) could not tell
            # whether the complete blocks' span is all of x
            return mean_compress(x, self.config, backend=self.backend)
        if count is None:
            count = self.config.num_cmp(x.shape[1]) - first
        if count <= 0:
            return x.new_zeros(x.shape[0], 0, x.shape[2], x.shape[3])
        return mean_compress(x[:, _token_span(self.config, first, count)], self.config, backend=self.backend)


class MLPCompression(nn.Module):
    """Learnable phi (paper Eq. 7): ``MLP(flatten(block + pos_emb))``, shared across heads.

    Args:
        head_dim: D of the tokens it compresses.
        config: block geometry (``cmp_block``, ``cmp_stride``).
        hidden: width of the MLP's hidden layer; default ``2 * head_dim``.
    """

    def __init__(self, head_dim: int, config: NSAConfig, hidden: Optional[int] = None) -> None:
        super().__init__()
        self.config = config
        hidden = hidden or 2 * head_dim
        self.pos_emb = nn.Parameter(torch.randn(config.cmp_block, head_dim) * head_dim**-0.5)
        self.mlp = nn.Sequential(
            nn.Linear(config.cmp_block * head_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, head_dim),
        )

    def emission_weights(self, dtype: torch.dtype) -> Optional[MLPWeights]:
        """The parameters as a decode step's emission in three launches takes them
        (:mod:`nsa.ops.decode.mlp_emission`), or None where it cannot stand in for
        :meth:`forward`: an ``mlp`` other than ``Linear``, exact ``GELU``, ``Linear`` with
        biases, parameters not of ``dtype`` (the cache's: float32 parameters under a 16-bit
        autocast run the modules), or ones that would need a gradient here."""
        layers = list(self.mlp) if isinstance(self.mlp, nn.Sequential) else []
        if len(layers) != 3:
            return None
        first, act, second = layers
        if not (isinstance(first, nn.Linear) and isinstance(act, nn.GELU) and act.approximate == "none"
                and isinstance(second, nn.Linear) and first.bias is not None and second.bias is not None):  # fmt: skip
            return None
        params = (self.pos_emb, first.weight, first.bias, second.weight, second.bias)
        if any(p.dtype != dtype or not p.is_contiguous() for p in params):
            return None
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return None
        return MLPWeights(*params)

    def forward(self, x: torch.Tensor, first: int = 0, count: Optional[int] = None) -> torch.Tensor:
        """``x [B, T, H, D]`` -> compressed tokens ``[first, first+count)`` as ``[B, count, H, D]``."""
        cfg = self.config
        whole = first == 0 and count is None  # every complete block: x unsliced (see below)
        if count is None:
            count = cfg.num_cmp(x.shape[1]) - first
        B, _, H, D = x.shape
        if count <= 0:
            return x.new_zeros(B, 0, H, D)
        # Heads first, and the blocks copied to one layout before the MLP: a graph traced for
        # any length (torch.export) must decide each slice and reshape without knowing the
        # length, and it can when the length's dimension is split off last, after the static H,
        # and x is not sliced to the blocks' span when that is all of it (on unfolded blocks in
        # another order, a flatten is a view or a copy depending on the length)
        span = (x if whole else x[:, _token_span(cfg, first, count)]).transpose(1, 2)  # [B, H, span, D]
        blocks = span.unfold(2, cfg.cmp_block, cfg.cmp_stride).transpose(-1, -2).contiguous()  # [B, H, N, l, D]
        blocks = blocks + self.pos_emb.to(x.dtype)
        out = self.mlp(blocks.reshape(-1, cfg.cmp_block * D)).view(B, H, count, -1)
        return out.transpose(1, 2).contiguous()  # [B, N, H, D], laid out as the cache keeps them
