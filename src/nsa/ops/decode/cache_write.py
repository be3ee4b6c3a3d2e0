"""A graph-safe decode step's new keys and values into a static cache: one launch for six buffers.

:meth:`nsa.NSACache.write` scatters each branch's new raw keys and values (six tensors) to
positions that live on the device. As six advanced-indexing assignments that is six launches of a
few kilobytes each at batch 1, each about 3 us inside a captured step: about 19 of the 207 us of
the profiled :class:`nsa.DecodeGraph` step of the benchmark layer (H200, session 37,
docs/perf/compile.md).
Here one launch copies them all; program ``(row, buffer)`` copies one token's heads of one buffer.

The result is the assignments' bit for bit: a copy, cast to the buffer's dtype.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from nsa.ops._triton.launch import LAUNCH_OPTIONS, next_power_of_2


@triton.jit
def cache_write_kernel(
    positions, k_slc, v_slc, k_win, v_win, k_cmp, v_cmp,
    k_slc_buf, v_slc_buf, k_win_buf, v_win_buf, k_cmp_buf, v_cmp_buf,
    T, CAPACITY, stride_pb, stride_pt,
    ROW_K: tl.constexpr, ROW_V: tl.constexpr, BLOCK: tl.constexpr,
):
    # program (b * T + t, buffer): the buffer's token t of sequence b, H heads of D (one row)
    i_bt, which = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_b, i_t = i_bt // T, i_bt % T
    position = tl.load(positions + i_b * stride_pb + i_t * stride_pt).to(tl.int64)
    if which == 0:
        src, dst = k_slc, k_slc_buf
    elif which == 1:
        src, dst = v_slc, v_slc_buf
    elif which == 2:
        src, dst = k_win, k_win_buf
    elif which == 3:
        src, dst = v_win, v_win_buf
    elif which == 4:
        src, dst = k_cmp, k_cmp_buf
    else:
        src, dst = v_cmp, v_cmp_buf
    row = tl.where(which % 2 == 0, ROW_K, ROW_V)  # keys and values alternate
    o = tl.arange(0, BLOCK)
    m = o < row
    x = tl.load(src + i_bt * row + o, mask=m)  # sources are contiguous [B, T, H, D]
    tl.store(dst + (i_b * CAPACITY + position) * row + o, x.to(dst.dtype.element_ty), mask=m)


def write_rows(buffers: Sequence[torch.Tensor], values: Sequence[torch.Tensor], positions: torch.Tensor) -> None:
    """``buffers[i][b, positions[b, t]] = values[i][b, t]`` for the six raw buffers in the cache's
    order (``nsa.modules.cache.RAW_BUFFERS``: ``k_slc, v_slc, k_win, v_win, k_cmp_raw,
    v_cmp_raw``): keys ``[B, T, H, Dk]`` into contiguous ``[B, capacity, H, Dk]`` buffers, values
    likewise with ``Dv``; ``positions`` ``[B, T]``, on the buffers' device. The caller checks the
    shapes (:meth:`nsa.NSACache.write`)."""
    B, T = positions.shape
    if B * T == 0:
        return
    values = [v.contiguous() for v in values]
    row_k, row_v = values[0][0, 0].numel(), values[1][0, 0].numel()
    cache_write_kernel[(B * T, 6)](
        positions, *values, *buffers, T, buffers[0].shape[1], *positions.stride(),
        ROW_K=row_k, ROW_V=row_v, BLOCK=next_power_of_2(max(row_k, row_v)), num_warps=4, **LAUNCH_OPTIONS,
    )

