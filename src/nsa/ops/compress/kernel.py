"""Mean pooling of raw tokens into compressed tokens: Triton kernels.

Same function as :mod:`nsa.ops.compress.reference`: compressed token ``i`` is the
mean of ``x[:, i*d : i*d + l]`` (``l = cmp_block``, ``d = cmp_stride``). The
backward is a gather (each raw position sums the ``l / d`` compressed tokens
that cover it), so it is deterministic and needs no atomics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.config import NSAConfig
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2


@triton.jit(do_not_specialize=["T", "NC"])
def mean_compress_fwd_kernel(
    x,  # [B, T, H, D]
    y,  # [B, NC, H, D]
    T,
    NC,
    H: tl.constexpr,
    D: tl.constexpr,
    L: tl.constexpr,
    S: tl.constexpr,
    BC: tl.constexpr,
    BD: tl.constexpr,
):
    """``BC`` compressed tokens x ``BD`` channels, summed row by row in float32.

    The ``L`` row loads are unrolled: none waits for the sum before it, so they are all in
    flight at once. As a loop each load waited for the one before (a chain of L memory round
    trips): on an H100 one 64k-token tensor took 44.5 against 80.5 us, 8k 9.0-9.8 against 39."""
    i_c, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_c = i_c * BC + tl.arange(0, BC)
    o_d = i_d * BD + tl.arange(0, BD)
    m_c = o_c < NC
    m_d = o_d < D
    m_cd = m_c[:, None] & m_d[None, :]
    # int64 base offsets: B * T * H * D passes 2**31 at long T.
    p_x = x + (i_b.to(tl.int64) * T * H + i_h) * D + (o_c.to(tl.int64) * S * H * D)[:, None] + o_d[None, :]
    b_acc = tl.zeros([BC, BD], dtype=tl.float32)
    for o in tl.static_range(L):
        b_acc += tl.load(p_x + o * H * D, mask=m_cd, other=0.0).to(tl.float32)  # [BC, BD]
    p_y = y + (i_b.to(tl.int64) * NC * H + i_h) * D + (o_c.to(tl.int64) * H * D)[:, None] + o_d[None, :]
    tl.store(p_y, (b_acc / L).to(y.dtype.element_ty), mask=m_cd)


@triton.jit(do_not_specialize=["T", "NC"])
def mean_compress_bwd_kernel(
    dy,  # [B, NC, H, D]
    dx,  # [B, T, H, D]
    T,
    NC,
    H: tl.constexpr,
    D: tl.constexpr,
    L: tl.constexpr,
    S: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
):
    i_t, i_d, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    m_t = o_t < T
    m_d = o_d < D
    b_acc = tl.zeros([BT, BD], dtype=tl.float32)
    # Raw position t lies in compressed tokens t//S - k for k < L//S (those that exist).
    for k in tl.static_range(L // S):  # unrolled: the loads do not wait for each other
        o_c = o_t // S - k
        m_c = m_t & (o_c >= 0) & (o_c < NC)
        p_dy = dy + (i_b.to(tl.int64) * NC * H + i_h) * D + (o_c.to(tl.int64) * H * D)[:, None] + o_d[None, :]
        b_acc += tl.load(p_dy, mask=m_c[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BT, BD]
    p_dx = dx + (i_b.to(tl.int64) * T * H + i_h) * D + (o_t.to(tl.int64) * H * D)[:, None] + o_d[None, :]
    tl.store(p_dx, (b_acc / L).to(dx.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])


def _block_d(D: int) -> int:
    return min(next_power_of_2(D), 128)


def mean_compress_fwd(x: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    """``x [B, T, H, D]`` (contiguous) -> ``[B, Nc, H, D]`` in ``x``'s dtype."""
    B, T, H, D = x.shape
    NC = config.num_cmp(T)
    y = torch.empty(B, NC, H, D, dtype=x.dtype, device=x.device)
    if NC == 0 or y.numel() == 0:
        return y
    # 8 tokens x 64 channels a program: H100, [8, 128] tiles took 58.5 and [16, 64] 60.5 against
    # 44.5 us at 64k tokens (one tensor), and 2 warps 60.4
    BC, BD = 8, min(_block_d(D), 64)
    grid = (cdiv(NC, BC), cdiv(D, BD), B * H)
    mean_compress_fwd_kernel[grid](
        x, y, T, NC, H=H, D=D, L=config.cmp_block, S=config.cmp_stride, BC=BC, BD=BD, **LAUNCH_OPTIONS
    )
    return y


def mean_compress_bwd(dy: torch.Tensor, T: int, config: NSAConfig) -> torch.Tensor:
    """``dy [B, Nc, H, D]`` -> ``dx [B, T, H, D]``; positions no token covers get 0."""
    B, NC, H, D = dy.shape
    dx = torch.empty(B, T, H, D, dtype=dy.dtype, device=dy.device)
    if dx.numel() == 0:
        return dx
    BT, BD = 64, _block_d(D)
    grid = (cdiv(T, BT), cdiv(D, BD), B * H)
    mean_compress_bwd_kernel[grid](
        dy.contiguous(), dx, T, NC, H=H, D=D, L=config.cmp_block, S=config.cmp_stride, BT=BT, BD=BD, **LAUNCH_OPTIONS
    )
    return dx


class MeanCompressFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, config: NSAConfig) -> torch.Tensor:
        ctx.config, ctx.T = config, x.shape[1]
        return mean_compress_fwd(x.contiguous(), config)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        return mean_compress_bwd(dy, ctx.T, ctx.config), None


def mean_compress(x: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    """``[B, T, H, D] -> [B, Nc, H, D]``; token ``i`` is the mean of ``x[:, i*d : i*d+l]``.

    Same signature as the reference; differentiable in ``x``.
    """
    return MeanCompressFunction.apply(x, config)
