"""A graph-safe decode step's traffic with a static cache, one launch each way.

:meth:`nsa.NSACache.write` scatters each branch's new raw keys and values (six tensors) to
positions that live on the device, and :meth:`nsa.NSACache.emit` gathers the raw blocks of the
newest compressed tokens and stores the tokens made of them. As advanced indexing that is one
launch per tensor plus the index arithmetic, each about 3 us inside a captured step: 19 us for
the six writes of the 207-us :class:`nsa.DecodeGraph` step profiled in session 37 and about 25
for the emission's gathers, stores and positions in session 38 (benchmark layer, H200,
docs/perf/compile.md).

- :func:`write_rows`: one launch copies rows into up to six buffers (keys and values
  alternating); program ``(row, buffer)`` copies one token's heads of one buffer. The same
  launch can advance the cache's device lengths.
- :func:`gather_cmp_blocks`: one launch reads the raw key and value blocks of the ``count``
  newest compressed tokens of each sequence, computing their positions from the sequences' last
  positions as the emission rule does.

Both move values bit for bit as the indexing does (the writes cast to the buffer's dtype).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from nsa.config import NSAConfig
from nsa.ops._triton.launch import LAUNCH_OPTIONS, next_power_of_2

#: elements a gather program copies at once (positions of a block times heads times head dims)
_GATHER_TILE = 4096


# the sources' strides: runtime values, never specialised (a stride of 1 would become a constant
# in one branch of the kernel's choice and a tensor in another, which Triton cannot join)
_SOURCE_STRIDES = [f"s{axis}_{kv}{i}" for i in range(3) for kv in "kv" for axis in "bt"]


@triton.jit(do_not_specialize=_SOURCE_STRIDES)
def cache_write_kernel(
    positions, k_0, v_0, k_1, v_1, k_2, v_2,
    k_0_buf, v_0_buf, k_1_buf, v_1_buf, k_2_buf, v_2_buf, lengths,
    T, CAPACITY, stride_pb, stride_pt,
    sb_k0, st_k0, sb_v0, st_v0, sb_k1, st_k1, sb_v1, st_v1, sb_k2, st_k2, sb_v2, st_v2,
    ROW_K: tl.constexpr, ROW_V: tl.constexpr, BLOCK: tl.constexpr, ADVANCE: tl.constexpr,
):
    # program (b * T + t, buffer): the buffer's token t of sequence b, H heads of D (one row);
    # the grid's second axis says how many of the pairs are real
    i_bt, which = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_b, i_t = i_bt // T, i_bt % T
    if ADVANCE and i_t == 0 and which == 0:  # one program a sequence; no program reads the lengths
        tl.store(lengths + i_b, tl.load(lengths + i_b) + T)
    position = tl.load(positions + i_b * stride_pb + i_t * stride_pt).to(tl.int64)
    # each source with its batch and token strides (its rows of H heads of D are contiguous; the
    # values of a decode step are views of the layer's one projection)
    if which == 0:
        src, dst, stride_b, stride_t = k_0, k_0_buf, sb_k0.to(tl.int64), st_k0.to(tl.int64)
    elif which == 1:
        src, dst, stride_b, stride_t = v_0, v_0_buf, sb_v0.to(tl.int64), st_v0.to(tl.int64)
    elif which == 2:
        src, dst, stride_b, stride_t = k_1, k_1_buf, sb_k1.to(tl.int64), st_k1.to(tl.int64)
    elif which == 3:
        src, dst, stride_b, stride_t = v_1, v_1_buf, sb_v1.to(tl.int64), st_v1.to(tl.int64)
    elif which == 4:
        src, dst, stride_b, stride_t = k_2, k_2_buf, sb_k2.to(tl.int64), st_k2.to(tl.int64)
    else:
        src, dst, stride_b, stride_t = v_2, v_2_buf, sb_v2.to(tl.int64), st_v2.to(tl.int64)
    row = tl.where(which % 2 == 0, ROW_K, ROW_V)  # keys and values alternate
    o = tl.arange(0, BLOCK)
    m = o < row
    x = tl.load(src + i_b * stride_b + i_t * stride_t + o, mask=m)
    tl.store(dst + (i_b * CAPACITY + position) * row + o, x.to(dst.dtype.element_ty), mask=m)


def write_rows(buffers: Sequence[torch.Tensor], values: Sequence[torch.Tensor], positions: torch.Tensor,
               lengths: Optional[torch.Tensor] = None) -> None:
    """``buffers[i][b, positions[b, t]] = values[i][b, t]`` for one to three key/value pairs
    (keys at even ``i``, values at odd; the cache's six raw buffers in
    ``nsa.modules.cache.RAW_BUFFERS`` order, or its two compressed ones): keys ``[B, T, H, Dk]``
    into contiguous ``[B, capacity, H, Dk]`` buffers of one capacity, values likewise with
    ``Dv``; ``positions`` ``[B, T]``, on the buffers' device. A value's rows may lie apart (any
    batch and token strides; a row's heads that are not contiguous are copied first). With
    ``lengths`` (contiguous ``[B]``, the cache's ``seq_lens``) the launch also adds ``T`` to each,
    which took a kernel of its own in a captured step (1.3 us, session 39). The caller checks the
    shapes (:meth:`nsa.NSACache.write`)."""
    if len(buffers) not in (2, 4, 6) or len(values) != len(buffers):
        raise ValueError(f"write_rows takes 1-3 key/value pairs, got {len(buffers)} buffers and {len(values)} values")
    B, T = positions.shape
    if B * T == 0:
        return
    values = [v if v[0, 0].is_contiguous() else v.contiguous() for v in values]
    row_k, row_v = values[0][0, 0].numel(), values[1][0, 0].numel()
    unused = 6 - len(buffers)  # pointers the grid never reaches: repeat the first pair
    values = [*values, *values[:2] * (unused // 2)]
    cache_write_kernel[(B * T, len(buffers))](
        positions, *values, *buffers, *buffers[:2] * (unused // 2), positions if lengths is None else lengths,
        T, buffers[0].shape[1], *positions.stride(), *[s for v in values for s in v.stride()[:2]],
        ROW_K=row_k, ROW_V=row_v, BLOCK=next_power_of_2(max(row_k, row_v)), ADVANCE=lengths is not None,
        num_warps=4, **LAUNCH_OPTIONS,
    )  # fmt: skip


@triton.jit
def newest_slot(last, i_c, COUNT, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr):
    """Slot of token ``i_c`` of the ``COUNT`` newest compressed tokens complete at position
    ``last`` (int64, a scalar or a tensor): ``floor((last + 1 - l) / d) - (COUNT - 1 - i_c)``, and
    0 for one not complete yet (clamping the numerator first gives the same slots and keeps the
    division non-negative)."""
    start = tl.maximum(last + 1 - CMP_BLOCK, 0)
    return tl.maximum(start // CMP_STRIDE - (COUNT - 1 - i_c), 0)


@triton.jit
def gather_cmp_blocks_kernel(
    last, k_raw, v_raw, k_blocks, v_blocks, index,
    COUNT, CAPACITY, stride_last, H,
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, ROWS: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
):
    # program (b * COUNT + c, which): raw block of sequence b's compressed token c of its COUNT
    # newest, keys (which 0) or values (1); ROWS positions of every head at a time
    i_bc, which = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_b, i_c = i_bc // COUNT, i_bc % COUNT
    slot = newest_slot(tl.load(last + i_b * stride_last).to(tl.int64), i_c, COUNT, CMP_BLOCK, CMP_STRIDE)
    if which == 0:
        src, dst = k_raw, k_blocks
        tl.store(index + i_bc, slot)
    else:
        src, dst = v_raw, v_blocks
    D = tl.where(which == 0, DK, DV)
    j = tl.arange(0, ROWS)[:, None, None]
    h = tl.arange(0, BH)[None, :, None]
    d = tl.arange(0, BD)[None, None, :]
    for j0 in range(0, CMP_BLOCK, ROWS):
        m = (j0 + j < CMP_BLOCK) & (h < H) & (d < D)
        # only a block not complete yet (invisible to every query) reaches past the end
        position = tl.minimum(slot * CMP_STRIDE + j0 + j, CAPACITY - 1)
        x = tl.load(src + ((i_b * CAPACITY + position) * H + h) * D + d, mask=m)  # [B, capacity, H, D]
        tl.store(dst + ((i_bc * H + h) * CMP_BLOCK + j0 + j) * D + d, x, mask=m)  # [B * COUNT, H, l, D]


def gather_cmp_blocks(
    k_raw: torch.Tensor, v_raw: torch.Tensor, last: torch.Tensor, count: int, config: NSAConfig,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The raw blocks of the ``count`` newest compressed tokens complete at positions ``last [B]``
    of contiguous ``k_raw [B, capacity, H, Dk]`` and ``v_raw [B, capacity, H, Dv]``:
    ``(k_blocks [B * count, l, H, Dk], v_blocks [B * count, l, H, Dv], slots [B, count])``, the
    blocks views of heads-first tensors, the slots the tokens' indices: 0 for one whose block is
    not complete yet, whose positions past the capacity clamp to its last, as
    :meth:`nsa.NSACache.emit` defines."""
    B, capacity, H = k_raw.shape[:3]
    l = config.cmp_block
    # stored heads first, [B * count, H, l, D], and returned as [B * count, l, H, D] views: the
    # learnable compression reads each head's block as one row, with no copy in between
    k_blocks = k_raw.new_empty(B * count, H, l, k_raw.shape[3]).transpose(1, 2)
    v_blocks = v_raw.new_empty(B * count, H, l, v_raw.shape[3]).transpose(1, 2)
    slots = torch.empty(B, count, dtype=torch.int64, device=k_raw.device)
    if B * count:
        BH, BD = next_power_of_2(H), next_power_of_2(max(k_raw.shape[3], v_raw.shape[3]))
        gather_cmp_blocks_kernel[(B * count, 2)](
            last, k_raw, v_raw, k_blocks, v_blocks, slots, count, capacity, last.stride(0), H,
            CMP_BLOCK=l, CMP_STRIDE=config.cmp_stride, ROWS=max(1, min(next_power_of_2(l), _GATHER_TILE // (BH * BD))),
            DK=k_raw.shape[3], DV=v_raw.shape[3], BH=BH, BD=BD, num_warps=4, **LAUNCH_OPTIONS,
        )  # fmt: skip
    return k_blocks, v_blocks, slots
