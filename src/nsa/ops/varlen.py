"""Packed variable-length batches (``cu_seqlens``) for :func:`nsa.ops.nsa_attention`.

Sequences packed along the time axis as ``[1, total, heads, dim]`` with boundaries
``cu_seqlens = [0, len_0, len_0 + len_1, ..., total]`` (the flash-attn convention)
run as padded batches ``[n, longest, heads, dim]``: every NSA branch is causal, so
positions padded after a sequence's end never reach its real outputs, and each
sequence starts at position 0 whatever its place in the pack.

Sequences are grouped by length class, half an octave wide (``(2^((c-1)/2), 2^(c/2)]``,
:data:`CLASSES_PER_OCTAVE`), one padded batch per class, so that no sequence is padded to
sqrt(2) times its length or more: a pack of one 64k document and many short ones does not
run every short one at 64k. Padding, unpacking and the return to packed order are gathers
(:class:`PadFunction`, :class:`UnpadFunction`: one gather of the pack each way, forward and
backward) with indices built on the device from the host's boundaries; layers that share a
pack share its layout (:func:`layout` keeps the last few). Boundaries kept on the host (a CPU
``cu_seqlens``) make a packed call free of any wait for the GPU; read from the GPU, they cost
one sync a call.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch


def check_cu_seqlens(cu_seqlens: object, total: int, batch: int) -> List[int]:
    """``cu_seqlens`` is a 1-D int32/int64 tensor ``[N + 1]`` of boundaries from 0 to ``total``;
    returns the boundaries as host integers.

    The values are read on the host once per call: a wrong boundary would silently mix
    sequences, and the padded shapes need the lengths. From a GPU tensor that read waits for the
    device (the only sync of a packed call); boundaries kept on the host (a CPU tensor, as data
    loaders make them) cost none, so the host can queue the packed call, and the next layer's,
    while the GPU still works.
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
        pad_slots: ``[n * longest - tokens]`` the slots past their sequence's end.
    """

    n: int
    longest: int
    source: torch.Tensor
    real_slots: torch.Tensor
    positions: torch.Tensor
    pad_slots: torch.Tensor


@dataclass(frozen=True)
class Layout:
    """How a pack runs: its :class:`Group` s, whose real positions together are every packed
    position once; ``pack_source``: for each packed position, its row among the groups' padded
    batches laid end to end; the pack's ``boundaries`` (host ints, 0 to ``total``)."""

    groups: List[Group]
    pack_source: torch.Tensor
    boundaries: Tuple[int, ...]

    @property
    def total(self) -> int:
        """Positions in the pack."""
        return self.boundaries[-1]

    @property
    def lengths(self) -> List[int]:
        """Each sequence's length, in pack order (host ints)."""
        return lengths_of(self.boundaries)

    def sequence_positions(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(sequence, position)`` of every packed token, int64 ``[total]`` each, on ``device``."""
        lens = host_to_device(torch.tensor(self.lengths, dtype=torch.long), device)
        return _runs(lens, self.total)

    def pad(self, x: torch.Tensor) -> List[torch.Tensor]:
        """``[1, total, ...]`` -> one ``[n, longest, ...]`` per group (:class:`PadFunction`)."""
        return list(PadFunction.apply(self, x))

    def unpad(self, outputs: List[torch.Tensor]) -> torch.Tensor:
        """The groups' padded outputs -> ``[1, total, ...]`` in pack order (:class:`UnpadFunction`)."""
        return UnpadFunction.apply(self, *outputs)

    def to_groups(self, x: torch.Tensor, zero_padding: bool) -> List[torch.Tensor]:
        """Gathers: ``[1, total, ...]`` -> ``[n, longest, ...]`` per group, a padded slot holding its
        sequence's last token or (``zero_padding``) zeros."""
        rest = x.shape[2:]
        batches = []
        for g in self.groups:
            batch = x[0].index_select(0, g.source)
            if zero_padding:
                batch.index_fill_(0, g.pad_slots, 0)
            batches.append(batch.view(g.n, g.longest, *rest))
        return batches

    def to_pack(self, batches: List[torch.Tensor]) -> torch.Tensor:
        """One gather: the groups' real slots -> ``[1, total, ...]`` in pack order (a new tensor)."""
        rest = batches[0].shape[2:]
        rows = torch.cat([b.reshape(-1, *rest) for b in batches]) if len(batches) > 1 else batches[0].reshape(-1, *rest)
        return rows.index_select(0, self.pack_source).unsqueeze(0)


class PadFunction(torch.autograd.Function):
    """``[1, total, ...]`` -> the groups' padded batches (:meth:`Layout.to_groups`).

    Backward: every branch is causal and a compressed token counts only once complete, so a
    padded slot reaches no real output and its gradient is zero; a packed position's gradient
    is then its real slot's alone, gathered by :meth:`Layout.to_pack`. (Autograd of the gathers
    would add each group's gradient into a zero tensor of the whole pack: a fill and a slow
    scatter-add of the pack per group.)
    """

    @staticmethod
    def forward(ctx, layout: Layout, x: torch.Tensor):
        ctx.layout = layout
        ctx.set_materialize_grads(False)  # a batch without gradient arrives as None, not a zero batch
        return tuple(layout.to_groups(x, zero_padding=False))

    @staticmethod
    def backward(ctx, *grads):
        if all(dy is None for dy in grads):
            return None, None
        like = next(dy for dy in grads if dy is not None)
        grads = [like.new_zeros((g.n, g.longest, *like.shape[2:])) if dy is None else dy
                 for g, dy in zip(ctx.layout.groups, grads)]
        return None, ctx.layout.to_pack(grads)


class UnpadFunction(torch.autograd.Function):
    """The groups' padded batches -> ``[1, total, ...]`` (:meth:`Layout.to_pack`). Backward: the
    gradient gathered back into padded batches, zeros in the padded slots (the kernels' backward
    reads them)."""

    @staticmethod
    def forward(ctx, layout: Layout, *outputs: torch.Tensor):
        ctx.layout = layout
        return layout.to_pack(list(outputs))

    @staticmethod
    def backward(ctx, dout):
        return (None, *ctx.layout.to_groups(dout, zero_padding=True))


#: Length classes per doubling of length: a class spans a factor ``2 ** (1 / CLASSES_PER_OCTAVE)``,
#: so padding adds less than that factor to any sequence. Narrower classes pad less but run more
#: batches, each a whole pipeline of launches and its host time: on an H200, packs of 64k tokens
#: ran 1-10 % faster in half octaves than in octaves (forward+backward), quarter octaves and a
#: cost-model grouping no faster (docs/perf/varlen.md).
CLASSES_PER_OCTAVE = 2


def length_class(n: int, per_octave: int = CLASSES_PER_OCTAVE) -> int:
    """Class of a length ``n >= 1``: the least ``c`` with ``n <= 2 ** (c / per_octave)``, in
    integers (``n ** per_octave <= 2 ** c``), so that no rounding moves a length across a border."""
    return (n ** per_octave - 1).bit_length()


def length_classes(lengths: List[int], per_octave: int = CLASSES_PER_OCTAVE) -> List[List[int]]:
    """Indices of the non-empty sequences grouped by length class (:func:`length_class`), classes
    by length and sequences in pack order within one; within a class the longest is less than
    ``2 ** (1 / per_octave)`` times the shortest (twice it for octaves, ``(2^(k-1), 2^k]``)."""
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
    source = source.clamp(max=max(total - 1, 0)).reshape(-1)
    seq, within = _runs(lens, tokens)
    pad_seq, pad_within = _runs(longest - lens, n * longest - tokens)
    return Group(n, longest, source, seq * longest + within, starts[seq] + within,
                 pad_seq * longest + lens[pad_seq] + pad_within)


def _runs(counts: torch.Tensor, size: int):
    """``(run, index within the run)`` of each of ``size = counts.sum()`` places laid out as runs of
    ``counts``, on the device (``size`` from the host: no sync)."""
    run = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts, output_size=size)
    first = torch.cumsum(counts, 0) - counts  # each run's first place
    return run, torch.arange(size, device=counts.device) - first[run]


def layout(cu_seqlens: torch.Tensor, max_seqlen: Optional[int], total: int, batch: int,
           device: torch.device, per_octave: int = CLASSES_PER_OCTAVE) -> Layout:
    """Checks a pack (see :func:`check_cu_seqlens` and :func:`check_max_seqlen`) and lays it out
    in groups of length classes (:func:`length_classes`). A pack of empty sequences only is one
    group of zero length.

    Layouts are kept by their boundaries' values (the last :data:`LAYOUTS_KEPT`), so the layers
    of a model that share one pack build its index tensors once."""
    boundaries = check_cu_seqlens(cu_seqlens, total, batch)
    check_max_seqlen(boundaries, max_seqlen)
    return _layout_of(tuple(boundaries), torch.device(device), per_octave)


#: Layouts :func:`layout` keeps, by boundaries, device and class width.
LAYOUTS_KEPT = 8


@functools.lru_cache(maxsize=LAYOUTS_KEPT)
def _layout_of(boundaries: Tuple[int, ...], device: torch.device, per_octave: int) -> Layout:
    lengths, total = lengths_of(boundaries), boundaries[-1]
    cu = host_to_device(torch.tensor(boundaries, dtype=torch.long), device)
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    classes = length_classes(lengths, per_octave)
    if not classes:  # nothing to attend to: one empty group keeps the shapes flowing
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return Layout([Group(len(lengths), 0, empty, empty, empty, empty)], empty, boundaries)
    groups = []
    for members in classes:
        index = host_to_device(torch.tensor(members), device)
        tokens = sum(lengths[i] for i in members)
        groups.append(_group(starts[index], lens[index], max(lengths[i] for i in members), tokens, total))
    pack_source = torch.empty(total, dtype=torch.long, device=device)
    offset = 0
    for g in groups:
        pack_source[g.positions] = g.real_slots + offset
        offset += g.n * g.longest
    return Layout(groups, pack_source, boundaries)


def cu_seqlens_of(lengths: Sequence[int]) -> torch.Tensor:
    """The boundaries ``[0, len_0, len_0 + len_1, ..., total]`` of sequences of ``lengths``, as
    an int32 host tensor (``cu_seqlens``; on the host, a packed call never waits for the GPU)."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def lengths_of(boundaries: Sequence[int]) -> List[int]:
    """Sequence lengths of a pack's boundaries ``[0, len_0, len_0 + len_1, ..., total]``."""
    return [b - a for a, b in zip(boundaries, boundaries[1:])]


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; a host tensor goes to a GPU through pinned memory, a copy that does not
    wait for the work already queued there (a plain copy from pageable memory synchronises)."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def check_max_seqlen(boundaries: List[int], max_seqlen: Optional[int]) -> None:
    """``max_seqlen`` (flash-attn's argument), when given, is an int at least as long as the
    pack's longest sequence; the padded lengths come from the pack itself."""
    if max_seqlen is None:
        return
    longest = max(lengths_of(boundaries))
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < longest:
        raise ValueError(f"max_seqlen must be an int >= the longest sequence ({longest}), got {max_seqlen!r}")
