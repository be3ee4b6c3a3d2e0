"""Packed variable-length batches (``cu_seqlens``) for :func:`nsa.ops.nsa_attention`.

Sequences packed along the time axis as ``[1, total, heads, dim]`` with boundaries
``cu_seqlens = [0, len_0, len_0 + len_1, ..., total]`` (the flash-attn convention)
run as padded batches ``[n, longest, heads, dim]``: every NSA branch is causal, so
positions padded after a sequence's end never reach its real outputs, and each
sequence starts at position 0 whatever its place in the pack.

Sequences are grouped by length class, ``(2^(k-1), 2^k]``, one padded batch per
class, so that no sequence is padded to twice its length or more: a pack of one
64k document and many short ones does not run every short one at 64k. Padding,
unpacking and the return to packed order are gathers with indices built on the
device (sizes come from the host boundaries), and autograd carries the gradients
back to the packed inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

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


@dataclass(frozen=True)
class Group:
    """Sequences of one length class, run as one padded batch ``[n, longest, ...]``.

    Attributes:
        n: sequences; longest: their padded length (the longest of them).
        source: ``[n * longest]`` packed position each padded slot reads (a slot past its
            sequence's end repeats the sequence's last token).
        real_slots: ``[tokens]`` padded slot of each real position, sequences in pack order.
        positions: ``[tokens]`` packed position of each of those real positions.
    """

    n: int
    longest: int
    source: torch.Tensor
    real_slots: torch.Tensor
    positions: torch.Tensor


@dataclass(frozen=True)
class Layout:
    """How a pack runs: its :class:`Group` s and ``rows``, for each packed position, its row
    among the groups' unpadded outputs laid end to end (None when those are in pack order)."""

    groups: List[Group]
    rows: Optional[torch.Tensor]

    def pad(self, x: torch.Tensor) -> List[torch.Tensor]:
        """``[1, total, ...]`` -> one ``[n, longest, ...]`` per group."""
        return [x[0].index_select(0, g.source).reshape(g.n, g.longest, *x.shape[2:]) for g in self.groups]

    def unpad(self, outputs: List[torch.Tensor]) -> torch.Tensor:
        """The groups' padded outputs -> ``[1, total, ...]`` in pack order."""
        real = [y.reshape(-1, *y.shape[2:]).index_select(0, g.real_slots) for g, y in zip(self.groups, outputs)]
        out = torch.cat(real) if len(real) > 1 else real[0]
        if self.rows is not None:
            out = out.index_select(0, self.rows)
        return out.unsqueeze(0)


#: Length classes per doubling of length: a class spans a factor ``2 ** (1 / CLASSES_PER_OCTAVE)``,
#: so padding adds less than that factor to any sequence. Narrower classes pad less but run more
#: batches, each a whole pipeline of launches (docs/perf/varlen.md measures the trade).
CLASSES_PER_OCTAVE = 1


def length_class(n: int, per_octave: int = CLASSES_PER_OCTAVE) -> int:
    """Class of a length ``n >= 1``: the least ``c`` with ``n <= 2 ** (c / per_octave)``, in
    integers (``n ** per_octave <= 2 ** c``), so that no rounding moves a length across a border."""
    return (n ** per_octave - 1).bit_length()


def length_classes(lengths: List[int], per_octave: int = CLASSES_PER_OCTAVE) -> List[List[int]]:
    """Indices of the non-empty sequences grouped by length class (:func:`length_class`), classes
    by length and sequences in pack order within one; within a class the longest is less than
    ``2 ** (1 / per_octave)`` times the shortest (twice it for one class an octave,
    ``(2^(k-1), 2^k]``)."""
    if isinstance(per_octave, bool) or not isinstance(per_octave, int) or per_octave < 1:
        raise ValueError(f"per_octave must be an int >= 1, got {per_octave!r}")
    classes: dict = {}
    for i, n in enumerate(lengths):
        if n > 0:
            classes.setdefault(length_class(n, per_octave), []).append(i)
    return [classes[k] for k in sorted(classes)]


def _group(starts: torch.Tensor, lens: torch.Tensor, longest: int, tokens: int, total: int) -> Group:
    """:class:`Group` of sequences with packed ``starts``/``lens`` (device tensors) holding ``tokens``
    real positions in all; every size is a host integer, so nothing waits for the device."""
    n = starts.numel()
    offset = torch.arange(longest, device=starts.device)
    source = starts[:, None] + torch.minimum(offset[None, :], (lens - 1)[:, None])
    seq = torch.repeat_interleave(torch.arange(n, device=starts.device), lens, output_size=tokens)
    first = torch.cumsum(lens, 0) - lens  # each sequence's first row among the group's real rows
    within = torch.arange(tokens, device=starts.device) - first[seq]
    source = source.clamp(max=max(total - 1, 0)).reshape(-1)
    return Group(n, longest, source, seq * longest + within, starts[seq] + within)


def layout(cu_seqlens: torch.Tensor, max_seqlen: Optional[int], total: int, batch: int,
           device: torch.device, per_octave: int = CLASSES_PER_OCTAVE) -> Layout:
    """Checks a pack (see :func:`check_cu_seqlens` and :func:`check_max_seqlen`) and lays it out
    in groups of length classes (:func:`length_classes`). A pack of empty sequences only is one
    group of zero length."""
    boundaries = check_cu_seqlens(cu_seqlens, total, batch)
    check_max_seqlen(boundaries, max_seqlen)
    lengths = [b - a for a, b in zip(boundaries, boundaries[1:])]
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    classes = length_classes(lengths, per_octave)
    if not classes:  # nothing to attend to: one empty group keeps the shapes flowing
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Layout([Group(len(lengths), 0, empty, empty, empty)], None)
    groups = []
    for members in classes:
        index = torch.tensor(members, device=device)
        tokens = sum(lengths[i] for i in members)
        groups.append(_group(starts[index], lens[index], max(lengths[i] for i in members), tokens, total))
    if len(groups) == 1:  # one class holds every non-empty sequence, in pack order
        return Layout(groups, None)
    # invert "row r of the groups' outputs is packed position positions[r]"
    positions = torch.cat([g.positions for g in groups])
    rows = torch.empty_like(positions)
    rows[positions] = torch.arange(total, device=device)
    return Layout(groups, rows)


def check_max_seqlen(boundaries: List[int], max_seqlen: Optional[int]) -> None:
    """``max_seqlen`` (flash-attn's argument), when given, is an int at least as long as the
    pack's longest sequence; the padded lengths come from the pack itself."""
    if max_seqlen is None:
        return
    longest = max(b - a for a, b in zip(boundaries, boundaries[1:]))
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < longest:
        raise ValueError(f"max_seqlen must be an int >= the longest sequence ({longest}), got {max_seqlen!r}")
