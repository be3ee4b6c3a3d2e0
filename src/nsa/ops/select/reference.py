"""Block scoring and top-n selection (spec Eqs. 8-11, pinned): the reference definition."""

from __future__ import annotations

import torch

from nsa.config import NSAConfig
from nsa.ops._reference import compute_dtype, masked_softmax, query_chunks, split_groups
from nsa.ops.compressed.reference import visible_cmp_count


def overlap_weights(num_cmp: int, num_blocks: int, config: NSAConfig, device, dtype) -> torch.Tensor:
    """``W[i, j] = |[i*d, i*d + l) ∩ [j*l', (j+1)*l')| / l``, shape ``[num_cmp, num_blocks]``.

    Mass-conserving: every row sums to 1 once the compressed token's block is
    fully inside the covered blocks, so ``p_slc = p_cmp @ W`` keeps total mass.
    """
    cmp_start = torch.arange(num_cmp, device=device)[:, None] * config.cmp_stride
    blk_start = torch.arange(num_blocks, device=device)[None, :] * config.sel_block
    lo = torch.maximum(cmp_start, blk_start)
    hi = torch.minimum(cmp_start + config.cmp_block, blk_start + config.sel_block)
    return (hi - lo).clamp_min(0).to(dtype) / config.cmp_block


def top_n(block_score: torch.Tensor, positions: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    """Eq. 11 with forced blocks and ties to the lower index.

    Args:
        block_score: ``[..., C, nblk]`` group scores, ``nblk`` covering the last query's block.
        positions: ``[C]`` absolute query positions.

    Returns:
        int32 ``[..., C, sel_count]``: chosen blocks ascending, padded with -1.
    """
    n = config.sel_count
    nblk = block_score.shape[-1]
    own = torch.div(positions, config.sel_block, rounding_mode="floor")[:, None]  # [C, 1]
    j = torch.arange(nblk, device=positions.device)[None, :]  # [1, nblk]
    visible = j <= own
    forced = visible & ((j < config.init_blocks) | (j > own - config.local_blocks))
    key = block_score.masked_fill(~visible, float("-inf")).masked_fill(forced, float("inf"))
    if nblk < n:
        key = torch.nn.functional.pad(key, (0, n - nblk), value=float("-inf"))
    # A stable descending sort keeps equal scores in index order: ties go to the lower block.
    sorted_key, order = torch.sort(key, dim=-1, descending=True, stable=True)
    chosen = order[..., :n]
    missing = torch.iinfo(torch.int64).max
    chosen = torch.where(sorted_key[..., :n] > float("-inf"), chosen, torch.full_like(chosen, missing))
    chosen = chosen.sort(dim=-1).values
    return torch.where(chosen == missing, torch.full_like(chosen, -1), chosen).to(torch.int32)


def select_blocks(
    q: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> torch.Tensor:
    """int32 ``[B, Tq, H, sel_count]``: each KV group's selected blocks per query."""
    B, Tq, HQ, _ = q.shape
    Nc, H = k_cmp.shape[1], k_cmp.shape[2]
    ct = compute_dtype(q.dtype)
    qg, kc = split_groups(q.to(ct), H), k_cmp.to(ct)
    last = q_offset + Tq - 1
    per_query = B * HQ * max(Nc, 1) + B * H * (last // config.sel_block + 1)
    chunks = []
    for start, end in query_chunks(Tq, per_query):
        positions = torch.arange(q_offset + start, q_offset + end, device=q.device)
        span = min(Nc, config.num_cmp(q_offset + end))
        nblk = (q_offset + end - 1) // config.sel_block + 1
        visible = torch.arange(span, device=q.device)[None, :] < visible_cmp_count(positions, config)[:, None]
        scores = torch.einsum("bchgd,bshd->bhgcs", qg[:, start:end], kc[:, :span]) * scale
        p_cmp, _ = masked_softmax(scores, visible)  # [B, H, G, C, span]
        weights = overlap_weights(span, nblk, config, q.device, ct)
        block_score = torch.matmul(p_cmp, weights).sum(dim=2)  # [B, H, C, nblk]: Eq. 10 group sum
        chunks.append(top_n(block_score, positions, config).permute(0, 2, 1, 3))
    return torch.cat(chunks, dim=1)
