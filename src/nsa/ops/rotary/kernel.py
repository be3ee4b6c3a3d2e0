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
    _rotate_heads(x + i_b * stride_xb + i_t * stride_xt, y + i_b * stride_yb + i_t * stride_yt, b_cos, b_sin,
                  i_h, HEADS, stride_xh, stride_yh, HALF, BD, BH)  # fmt: skip


@triton.jit
def _rotate_heads(x_row, y_row, b_cos, b_sin, i_h, HEADS, stride_xh, stride_yh,
                  HALF: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr):
    """Heads ``[i_h * BH, + BH)`` of one position: ``x_row`` rotated by ``(b_cos, b_sin)``
    (float32 ``[1, BD]``) into ``y_row``, in float32 with one rounding."""
    o_d = tl.arange(0, BD)
    o_h = i_h * BH + tl.arange(0, BH)
    m_x = (o_h < HEADS)[:, None] & (o_d < HALF)[None, :]
    p_x = x_row + o_h[:, None] * stride_xh + o_d[None, :]
    b_x1 = tl.load(p_x, mask=m_x, other=0.0).to(tl.float32)
    b_x2 = tl.load(p_x + HALF, mask=m_x, other=0.0).to(tl.float32)
    p_y = y_row + o_h[:, None] * stride_yh + o_d[None, :]
    tl.store(p_y, (b_x1 * b_cos - b_x2 * b_sin).to(y_row.dtype.element_ty), mask=m_x)
    tl.store(p_y + HALF, (b_x1 * b_sin + b_x2 * b_cos).to(y_row.dtype.element_ty), mask=m_x)


@triton.jit
def _table_values(b_angle, dtype: tl.constexpr):
    """RoPE's table values of float64 angles: ``(cos, sin)`` rounded through float32 to ``dtype``,
    as PyTorch rounds a float64 to a 16-bit type. The tables' kernel and the rotation at the
    lengths both round here, so the two agree bit for bit."""
    return tl.cos(b_angle).to(tl.float32).to(dtype), tl.sin(b_angle).to(tl.float32).to(dtype)


@triton.jit
def _table_entries(position, inv_freq, HALF: tl.constexpr, BD: tl.constexpr, dtype: tl.constexpr):
    """``(cos, sin)`` of ``position * inv_freq`` (a float64 angle, as :func:`rope_tables_kernel`),
    the tables' values widened to float32 ``[1, BD]``."""
    o_d = tl.arange(0, BD)
    b_angle = position.to(tl.float64) * tl.load(inv_freq + o_d, mask=o_d < HALF, other=0.0)
    b_cos, b_sin = _table_values(b_angle, dtype)
    return b_cos.to(tl.float32)[None, :], b_sin.to(tl.float32)[None, :]


@triton.jit
def rotary_at_lengths_kernel(
    x, lengths, inv_freq, y, positions, T, HEADS,
    stride_xb, stride_xt, stride_xh, stride_yb, stride_yt, stride_yh,
    HALF: tl.constexpr, BD: tl.constexpr, BH: tl.constexpr,
):
    # program (b * T + t, head tile): token t of sequence b sits at lengths[b] + t; the program
    # of the first head tile writes that position out. Its table entries are computed here as
    # rope_tables_kernel computes them (the same float64 angle, the same roundings): bit for bit
    # the rotation by the tables, without their launch
    i_bt, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i_b, i_t = i_bt // T, i_bt % T
    position = tl.load(lengths + i_b).to(tl.int64) + i_t
    if i_h == 0:
        tl.store(positions + i_bt, position)
    b_cos, b_sin = _table_entries(position, inv_freq, HALF, BD, y.dtype.element_ty)
    _rotate_heads(x + i_b * stride_xb + i_t * stride_xt, y + i_b * stride_yb + i_t * stride_yt, b_cos, b_sin,
                  i_h, HEADS, stride_xh, stride_yh, HALF, BD, BH)  # fmt: skip


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


def rotate_at_lengths(x: torch.Tensor, lengths: torch.Tensor, inv_freq: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:
    """A decode step's rotation in one launch: ``x [B, T, heads, D]`` (rows of any stride, each
    head contiguous) rotated to positions ``lengths[b] + t`` (int32 ``[B]``), which are written
    into ``positions`` (int64 ``[B, T]``, contiguous). Bit for bit :func:`rope_tables` at those
    positions then :func:`rotary`, whose three launches (the positions' addition too) this
    replaces."""
    B, T, heads, D = x.shape
    half = D // 2
    if tuple(positions.shape) != (B, T) or positions.dtype != torch.int64 or not positions.is_contiguous():
        raise ValueError(f"positions must be a contiguous int64 [B, T] = [{B}, {T}] tensor, got {positions.dtype} "
                         f"{list(positions.shape)}")  # fmt: skip
    if tuple(lengths.shape) != (B,) or lengths.dtype != torch.int32:
        raise ValueError(f"lengths must be int32 [B] = [{B}], got {lengths.dtype} {list(lengths.shape)}")
    if tuple(inv_freq.shape) != (half,) or inv_freq.dtype != torch.float64:
        raise ValueError(f"inv_freq must be float64 [D/2] = [{half}], got {inv_freq.dtype} {list(inv_freq.shape)}")
    y = torch.empty(B, T, heads, D, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    x = last_dim_contiguous(x)
    BD = next_power_of_2(half)
    BH = min(next_power_of_2(heads), max(1, 4096 // BD))  # at most 4096 elements a half
    rotary_at_lengths_kernel[(B * T, cdiv(heads, BH))](
        x, lengths, inv_freq, y, positions, T, heads, *x.stride()[:3], *y.stride()[:3], HALF=half, BD=BD, BH=BH,
        **LAUNCH_OPTIONS,
    )  # fmt: skip
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
    b_cos, b_sin = _table_values(b_angle, cos.dtype.element_ty)  # cos and sin share a dtype
    tl.store(cos + p, b_cos, mask=m)
    tl.store(sin + p, b_sin, mask=m)


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
