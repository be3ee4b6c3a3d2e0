"""Rotary position embedding: one Triton pass each way.

Same function as :mod:`nsa.ops.rotary.reference`, whose PyTorch form launches six elementwise
kernels and a concatenation for each rotated tensor: in a 16k forward of a layer with 64 query
heads they took 1.3 of 8.6 ms (H200, session 36, docs/perf/compile.md). Here the forward reads
``x`` and the table once and writes ``y``; the backward rotates the gradient back (the same
kernel, the angle negated). Arithmetic is float32 with one rounding to the output's dtype, so
16-bit results may differ from the reference's (which rounds each product) by one unit in the
last place.

Each program owns one position of one sequence and ``BH`` heads of it; the table's row is
loaded once for them.

The tables themselves (:func:`rope_tables`) take one launch too, where PyTorch takes six (the
positions cast, the angles, their cosines and sines, two casts): in a layer's captured decode step
those six took about 9 of its 145 us of kernel time (H200, session 38, docs/perf/compile.md).
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from nsa.ops._triton.attention import last_dim_contiguous
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2


@triton.jit
def rotary_kernel(
    x, cos, sin, y, T, HEADS,
    stride_xb, stride_xt, stride_xh, stride_cb, stride_ct, stride_yb, stride_yt, stride_yh,
    HALF: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr, INVERSE: tl.constexpr,
):
    i_bt, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_b, i_t = i_bt // T, i_bt % T
    o_d = tl.arange(0, BD)
    m_d = o_d < HALF
    p_c = i_b * stride_cb + i_t * stride_ct + o_d
    b_cos = tl.load(cos + p_c, mask=m_d, other=0.0).to(tl.float32)[None, :]
    b_sin = tl.load(sin + p_c, mask=m_d, other=0.0).to(tl.float32)[None, :]
    if INVERSE:  # the backward: rotation by the opposite angle
        b_sin = -b_sin
    o_h = i_h * BH + tl.arange(0, BH)
    m_x = (o_h < HEADS)[:, None] & m_d[None, :]
    p_x = x + i_b * stride_xb + i_t * stride_xt + o_h[:, None] * stride_xh + o_d[None, :]
    b_x1 = tl.load(p_x, mask=m_x, other=0.0).to(tl.float32)
    b_x2 = tl.load(p_x + HALF, mask=m_x, other=0.0).to(tl.float32)
    p_y = y + i_b * stride_yb + i_t * stride_yt + o_h[:, None] * stride_yh + o_d[None, :]
    tl.store(p_y, (b_x1 * b_cos - b_x2 * b_sin).to(y.dtype.element_ty), mask=m_x)
    tl.store(p_y + HALF, (b_x1 * b_sin + b_x2 * b_cos).to(y.dtype.element_ty), mask=m_x)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Launch the kernel: ``x [B, T, heads, D]`` rotated by the tables ``[(B,) T, 1, D/2]``
    (``inverse``: by the opposite angles)."""
    B, T, heads, D = x.shape
    y = torch.empty(B, T, heads, D, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    x = last_dim_contiguous(x)
    cos, sin = cos.contiguous(), sin.contiguous()  # one layout: the kernel takes one pair of table strides
    # a [T, 1, D/2] table serves every sequence: batch stride 0
    stride_cb, stride_ct = (cos.stride(0), cos.stride(1)) if cos.dim() == 4 else (0, cos.stride(0))
    half = D // 2
    BD = next_power_of_2(half)
    BH = min(next_power_of_2(heads), max(1, 4096 // BD))  # at most 4096 elements a half
    rotary_kernel[(B * T, cdiv(heads, BH))](
        x, cos, sin, y, T, heads, *x.stride()[:3], stride_cb, stride_ct, *y.stride()[:3],
        HALF=half, BD=BD, BH=BH, INVERSE=inverse, **LAUNCH_OPTIONS,
    )
    return y


class RotaryFunction(torch.autograd.Function):
    """Differentiable in ``x``; the tables are constants (positions are indices)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return rotary(x, cos, sin)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return rotary(dy, cos, sin, inverse=True), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same signature as the reference; differentiable in ``x``."""
    return RotaryFunction.apply(x, cos, sin)


@triton.jit
def rope_tables_kernel(
    positions, inv_freq, cos, sin, N,
    HALF: tl.constexpr, BD: tl.constexpr, BP: tl.constexpr,
):
    # program i: positions [i * BP, (i + 1) * BP) of the flattened [(B,) T], every frequency
    o_p = tl.program_id(0).to(tl.int64) * BP + tl.arange(0, BP)
    o_d = tl.arange(0, BD)
    m_p, m_d = o_p < N, o_d < HALF
    b_pos = tl.load(positions + o_p, mask=m_p, other=0).to(tl.float64)
    b_freq = tl.load(inv_freq + o_d, mask=m_d, other=0.0)
    b_angle = b_pos[:, None] * b_freq[None, :]  # float64, as the reference
    m = m_p[:, None] & m_d[None, :]
    p = o_p[:, None] * HALF + o_d[None, :]
    # through float32 to the tables' dtype, as PyTorch rounds a float64 to a 16-bit type
    tl.store(cos + p, tl.cos(b_angle).to(tl.float32).to(cos.dtype.element_ty), mask=m)
    tl.store(sin + p, tl.sin(b_angle).to(tl.float32).to(sin.dtype.element_ty), mask=m)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same signature as the reference: one launch writes both tables."""
    half = inv_freq.shape[0]
    shape = (*positions.shape, 1, half)
    cos = torch.empty(shape, dtype=dtype, device=positions.device)
    sin = torch.empty(shape, dtype=dtype, device=positions.device)
    N = positions.numel()
    if N == 0 or half == 0:
        return cos, sin
    BD = next_power_of_2(half)
    BP = max(1, min(next_power_of_2(N), 1024 // BD))  # at most 1024 angles a program
    rope_tables_kernel[(cdiv(N, BP),)](
        positions.contiguous(), inv_freq.contiguous(), cos, sin, N, HALF=half, BD=BD, BP=BP, num_warps=4,
        **LAUNCH_OPTIONS,
    )
    return cos, sin
