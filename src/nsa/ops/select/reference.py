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


def _chunk_scores(qg: torch.Tensor, kc: torch.Tensor, first: int, config: NSAConfig, scale: float) -> torch.Tensor:
    """Eq. 10's group scores ``[B, H, C, nblk]`` of the grouped queries ``qg [B, C, H, G, D]`` at
    positions ``first ...``, ``nblk`` covering the last one's block."""
    end = first + qg.shape[1]
    positions = torch.arange(first, end, device=qg.device)
    span = min(kc.shape[1], config.num_cmp(end))  # compressed tokens any query here can see
    nblk = (end - 1) // config.sel_block + 1
    visible = torch.arange(span, device=qg.device)[None, :] < visible_cmp_count(positions, config)[:, None]
    scores = torch.einsum("bchgd,bshd->bhgcs", qg, kc[:, :span]) * scale
    p_cmp, _ = masked_softmax(scores, visible)  # [B, H, G, C, span]
    weights = overlap_weights(span, nblk, config, qg.device, qg.dtype)
    return torch.matmul(p_cmp, weights).sum(dim=2)  # [B, H, C, nblk]: Eq. 10 group sum


def _query_chunks(q: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig, q_offset: int):
    """``(first position, grouped queries [B, C, H, G, D], compressed keys)`` of each query chunk,
    in the compute dtype."""
    B, Tq, HQ, _ = q.shape
    Nc, H = k_cmp.shape[1], k_cmp.shape[2]
    ct = compute_dtype(q.dtype)
    qg, kc = split_groups(q.to(ct), H), k_cmp.to(ct)
    last = q_offset + Tq - 1
    per_query = B * HQ * max(Nc, 1) + B * H * (last // config.sel_block + 1)
    for start, end in query_chunks(Tq, per_query):
        yield q_offset + start, qg[:, start:end], kc


def block_scores(q: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig, scale: float, q_offset: int) -> torch.Tensor:
    """The group scores that :func:`select_blocks` ranks, ``[B, Tq, H, nblk]`` in the compute
    dtype, ``nblk`` covering the last query's block; ``-inf`` past each query's own block.
    For tests and analysis: it holds every query's row at once."""
    B, Tq, H = q.shape[0], q.shape[1], k_cmp.shape[2]
    nblk = max(0, (q_offset + Tq - 1) // config.sel_block + 1)
    rows = [q.new_zeros(B, H, 0, nblk, dtype=compute_dtype(q.dtype))]
    for first, qg, kc in _query_chunks(q, k_cmp, config, q_offset):
        if qg.shape[1]:
            score = _chunk_scores(qg, kc, first, config, scale)  # covers this chunk's blocks only
            rows.append(torch.nn.functional.pad(score, (0, nblk - score.shape[-1])))
    own = torch.div(torch.arange(q_offset, q_offset + Tq, device=q.device), config.sel_block, rounding_mode="floor")
    past_own = torch.arange(nblk, device=q.device) > own[:, None, None]  # [Tq, 1, nblk]
    return torch.cat(rows, dim=2).permute(0, 2, 1, 3).masked_fill(past_own, float("-inf"))


def select_blocks(
    q: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> torch.Tensor:
    """int32 ``[B, Tq, H, sel_count]``: each KV group's selected blocks per query."""
    chunks = []
    for first, qg, kc in _query_chunks(q, k_cmp, config, q_offset):
        positions = torch.arange(first, first + qg.shape[1], device=q.device)
        chunks.append(top_n(_chunk_scores(qg, kc, first, config, scale), positions, config).permute(0, 2, 1, 3))
    return torch.cat(chunks, dim=1)
