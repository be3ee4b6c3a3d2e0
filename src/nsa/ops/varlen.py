"""Packed variable-length batches (``cu_seqlens``) for :func:`nsa.ops.nsa_attention`.

Sequences packed along the time axis as ``[1, total, heads, dim]`` with boundaries
``cu_seqlens = [0, len_0, len_0 + len_1, ..., total]`` (the flash-attn convention)
run as one padded batch ``[N, max_seqlen, heads, dim]``: every NSA branch is causal,
so positions padded after a sequence's end never reach its real outputs, and each
sequence starts at position 0 whatever its place in the pack. Padding and unpacking
are single gathers with indices built on the device, and autograd carries the
gradients back to the packed inputs.

Cost: the kernels also compute the padded tails, ``N * max_seqlen - total``
positions; packs of similar lengths waste little.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch


def check_cu_seqlens(cu_seqlens: object, total: int, batch: int) -> List[int]:
    """``cu_seqlens`` is a 1-D int32/int64 tensor ``[N + 1]`` of boundaries from 0 to ``total``;
    returns the boundaries as host integers.

    The values are read on the host once per call (the only sync of a packed call): a
    wrong boundary would silently mix sequences, and the padded shape needs the longest.
    """
    if batch != 1:
        raise ValueError(f"with cu_seqlens the inputs are packed as [1, total, ...], got batch size {batch}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be a 1-D int32/int64 tensor, got {_describe(cu_seqlens)}")
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must hold at least [0, total], got {cu_seqlens.tolist()}")
    values = cu_seqlens.tolist()
    if values[0] != 0 or values[-1] != total or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(
            f"cu_seqlens must rise from 0 to the packed length {total} without decreasing, got {values}"
        )
    return values


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {list(x.shape)}"
    return type(x).__name__


def pack_index(cu_seqlens: torch.Tensor, max_seqlen: int, total: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(source [N * max_seqlen], real_slots [total])``: the packed position each padded
    slot reads (a slot past its sequence's end repeats the sequence's last token; an empty
    sequence reads any valid token) and, in packed order, the slot of every real position."""
    cu = cu_seqlens.long()
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    offset = torch.arange(max_seqlen, device=cu.device)
    last = torch.clamp(lens - 1, min=0)
    source = (starts[:, None] + torch.minimum(offset[None, :], last[:, None])).clamp(max=max(total - 1, 0))
    # the slot of packed position p: its sequence i (the first boundary above p), then its offset
    position = torch.arange(total, device=cu.device)
    seq = torch.searchsorted(cu[1:], position, right=True)
    real_slots = seq * max_seqlen + position - starts[seq]
    return source.reshape(-1), real_slots


def pad(x: torch.Tensor, source: torch.Tensor, n: int, max_seqlen: int) -> torch.Tensor:
    """``[1, total, ...]`` -> ``[N, max_seqlen, ...]``."""
    return x[0].index_select(0, source).reshape(n, max_seqlen, *x.shape[2:])


def unpad(x: torch.Tensor, real_slots: torch.Tensor) -> torch.Tensor:
    """``[N, max_seqlen, ...]`` -> ``[1, total, ...]``, keeping the real positions in order."""
    return x.reshape(-1, *x.shape[2:]).index_select(0, real_slots).unsqueeze(0)


def layout(cu_seqlens: torch.Tensor, max_seqlen: Optional[int], total: int, batch: int,
           device: torch.device) -> Tuple[int, int, torch.Tensor, torch.Tensor]:
    """Checks a pack and lays it out: ``(sequences N, padded length, source, real_slots)``
    (see :func:`check_cu_seqlens`, :func:`max_length` and :func:`pack_index`)."""
    boundaries = check_cu_seqlens(cu_seqlens, total, batch)
    n, longest = len(boundaries) - 1, max_length(boundaries, max_seqlen)
    source, real_slots = pack_index(cu_seqlens.to(device), longest, total)
    return n, longest, source, real_slots


def max_length(boundaries: List[int], max_seqlen: Optional[int]) -> int:
    """The longest sequence: ``max_seqlen`` when given (checked), else from the host boundaries."""
    longest = max(b - a for a, b in zip(boundaries, boundaries[1:]))
    if max_seqlen is None:
        return longest
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < longest:
        raise ValueError(f"max_seqlen must be an int >= the longest sequence ({longest}), got {max_seqlen!r}")
    return max_seqlen
