"""Building blocks shared by the reference implementations (pure PyTorch).

The references define NSA: they favour clarity and exactness over speed, compute
in float32 for half-precision inputs (float64 stays float64) and walk the query
axis in chunks so that long sequences never materialise a ``T x T`` tensor.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Tuple, TypeVar

import torch
from torch.utils.checkpoint import checkpoint

from nsa import flags

ChunkResult = TypeVar("ChunkResult")

# Upper bound on the elements of one chunk's score tensor (256 Mi elements, ~1 GiB in fp32).
_SCORE_BUDGET = 1 << 28


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of the reference: float64 stays, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def query_chunks(num_queries: int, per_query_elems: int, most: Optional[int] = None) -> Iterator[Tuple[int, int]]:
    """``(start, end)`` chunks of the query axis that keep one chunk's scores in budget: at most
    ``per_query_elems`` score elements a query, and at most ``most`` queries a chunk where given.

    ``NSA_REFERENCE_CHUNK`` overrides the automatic size.
    """
    chunk = flags.get("NSA_REFERENCE_CHUNK")
    if chunk <= 0:
        chunk = max(1, min(_SCORE_BUDGET // max(1, per_query_elems), most or num_queries or 1))
    # An empty query axis still yields one empty chunk, so callers always have a piece to concatenate.
    for start in range(0, max(num_queries, 1), chunk):
        yield start, min(num_queries, start + chunk)


def map_query_chunks(
    chunk_fn: Callable[[int, int], ChunkResult], num_queries: int, per_query_elems: int, most: Optional[int] = None
) -> List[ChunkResult]:
    """``[chunk_fn(start, end) for each chunk of query_chunks(num_queries, per_query_elems, most)]``.

    Where autograd records the call, each chunk runs under a (non-reentrant) checkpoint: the graph
    keeps what the chunk returns, and the backward recomputes one chunk's scores and gathered keys
    at a time. Kept for every chunk, those made the backward's memory grow with the work, not with
    the outputs: 48 GiB for the selected branch at T = 3001 with 16 KV heads in float32.
    """
    chunks = query_chunks(num_queries, per_query_elems, most)
    if not torch.is_grad_enabled():
        return [chunk_fn(start, end) for start, end in chunks]
    # The references draw no random numbers, so there is no RNG state to save and restore.
    return [checkpoint(chunk_fn, start, end, use_reentrant=False, preserve_rng_state=False) for start, end in chunks]


def masked_softmax(scores: torch.Tensor, visible: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the last axis restricted to ``visible``; returns ``(probs, lse)``.

    A row with nothing visible gets probabilities 0 and ``lse = -inf``; neither the
    forward nor the backward of such a row produces NaN.
    """
    if scores.shape[-1] == 0:
        # No key at all (e.g. no compressed token complete yet): amax would reject the empty axis.
        return scores, scores.new_full(scores.shape[:-1], float("-inf"))
    scores = scores.masked_fill(~visible, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    # Softmax is shift-invariant, so the shift carries no gradient; empty rows shift by 0.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    weights = torch.exp(scores - row_max)
    denom = weights.sum(dim=-1, keepdim=True)
    nonempty = denom > 0
    safe_denom = torch.where(nonempty, denom, torch.ones_like(denom))
    probs = weights / safe_denom
    lse = torch.where(nonempty, row_max + torch.log(safe_denom), torch.full_like(denom, float("-inf")))
    return probs, lse.squeeze(-1)


def split_groups(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[B, T, HQ, D] -> [B, T, H, G, D]``: query heads grouped by their KV head."""
    B, T, HQ, D = q.shape
    return q.reshape(B, T, num_kv_heads, HQ // num_kv_heads, D)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of a query chunk over one shared key range under a ``[C, S]`` mask.

    Args:
        q: ``[B, C, HQ, Dk]``; k: ``[B, S, H, Dk]``; v: ``[B, S, H, Dv]``;
        visible: bool ``[C, S]``, the same for every batch and head.

    Returns:
        ``o [B, C, HQ, Dv]`` in the compute dtype and ``lse [B, C, HQ]``.
    """
    B, C, HQ, _ = q.shape
    H = k.shape[2]
    qg = split_groups(q, H)
    scores = torch.einsum("bchgd,bshd->bhgcs", qg, k) * scale
    probs, lse = masked_softmax(scores, visible)
    o = torch.einsum("bhgcs,bshv->bchgv", probs, v)
    return o.flatten(2, 3), lse.permute(0, 3, 1, 2).reshape(B, C, HQ)
