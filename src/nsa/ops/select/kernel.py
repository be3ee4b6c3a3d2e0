"""Block scoring and top-n selection: Triton kernel.

Same function as :mod:`nsa.ops.select.reference`. The kernel is the fused
compressed-attention forward of :mod:`nsa.ops._triton.compressed_fwd` run
without the output: pass 1 finds each head's lse over the visible compressed
tokens, pass 2 recomputes the probabilities, sums them over the heads of the
group and maps them onto selection blocks; the block scores of a bounded chunk
of queries go to a buffer that :mod:`nsa.ops._triton.block_topn` ranks. No
``[T, Nc]`` tensor is written. The selection has no gradient (it returns indices).
"""

from __future__ import annotations

import torch

from nsa.config import NSAConfig
from nsa.ops._triton.compressed_fwd import compressed_fwd


def select_blocks(
    q: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> torch.Tensor:
    """int32 ``[B, Tq, H, sel_count]``: each KV group's selected blocks per query,
    ascending and padded with -1 (same signature as the reference)."""
    q, k_cmp = q.detach().contiguous(), k_cmp.detach().contiguous()
    _, _, block_idx = compressed_fwd(q, k_cmp, k_cmp, config, scale, q_offset, store_o=False, select=True)
    return block_idx
