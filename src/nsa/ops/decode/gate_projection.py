"""A decode step's gates in one launch: ``sigmoid(x @ weight.T + bias)``.

:class:`nsa.NSAAttention` gates each query head's three branches by ``sigmoid(gate_proj(x))``.
In a captured decode step at batch 1 that was cuBLAS's product with its bias (5.6 us) and
PyTorch's sigmoid (1.4 us) for a ``[1, 2048] x [2048, 192]`` product, 786 KB of weights
(benchmark layer, H200, session 40; docs/perf/compile.md). Here one launch does both, and on
Hopper it starts while the launch before it (the rotation of the queries and keys, which lets
it) runs: the gates need nothing the rotation writes, so only their store waits for it.

:func:`gate_projection_kernel`: program ``(output tile, row tile)`` multiplies its rows of ``x``
by its rows of ``weight`` over the whole model width, adds the bias, rounds as ``nn.Linear``
returns the logits, applies the sigmoid in float32 and rounds again, as ``torch.sigmoid`` does on
16-bit tensors. So the gates differ from the modules' only in the product's order of summation.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from nsa.ops._triton.attention import dot_precision
from nsa.ops._triton.device import pdl_supported
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2


@triton.jit
def gate_projection_kernel(
    x, weight, bias, gates, M, N, K, stride_xm,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
):
    i_n, i_m = tl.program_id(0), tl.program_id(1)
    rows = i_m.to(tl.int64) * BM + tl.arange(0, BM)
    cols = i_n * BN + tl.arange(0, BN)
    in_rows, in_cols = rows < M, cols < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        in_k = k < K
        x_tile = tl.load(x + rows[:, None] * stride_xm + k[None, :], mask=in_rows[:, None] & in_k[None, :], other=0.0)
        w_tile = tl.load(weight + cols[:, None].to(tl.int64) * K + k[None, :], mask=in_cols[:, None] & in_k[None, :],
                         other=0.0)  # fmt: skip
        acc = tl.dot(x_tile, tl.trans(w_tile), acc, input_precision=PREC)
    dtype = gates.dtype.element_ty
    logits = (acc + tl.load(bias + cols, mask=in_cols, other=0.0).to(tl.float32)[None, :]).to(dtype)
    out = tl.sigmoid(logits.to(tl.float32)).to(dtype)
    if PDL:  # every program waits, so that this launch's end implies the end of the one before
        gdc_wait()
    tl.store(gates + rows[:, None] * N + cols[None, :], out, mask=in_rows[:, None] & in_cols[None, :])


def project_gates(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, pdl: Optional[bool] = None) -> torch.Tensor:
    """``sigmoid(x @ weight.T + bias)``: ``x [..., K]`` (rows of any stride, each contiguous),
    ``weight [N, K]`` and ``bias [N]`` contiguous, all of one dtype on one device; the result
    ``[..., N]`` in that dtype. ``pdl``: whether the launch may start while the one before it runs
    (default: on a GPU that has programmatic dependent launch); it changes when, never what."""
    *lead, K = x.shape
    N = weight.shape[0]
    if tuple(weight.shape) != (N, K) or tuple(bias.shape) != (N,):
        raise ValueError(f"weight must be [N, {K}] and bias [N], got {list(weight.shape)} and {list(bias.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t.dtype != x.dtype or t.device != x.device or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {x.dtype} tensor on {x.device}, got {t.dtype} on {t.device}")
    rows = x.reshape(-1, K)
    if rows.numel() and rows.stride(1) != 1:
        rows = rows.contiguous()
    M = rows.shape[0]
    gates = torch.empty(*lead, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return gates
    on_gpu = x.device.type == "cuda"
    min_dot = 16 if on_gpu else 1  # a tl.dot's every side is at least 16 on a GPU
    BM = max(min_dot, min(16, next_power_of_2(M)))
    BN = max(min_dot, min(16, next_power_of_2(N)))  # 16 output units a program: 12 programs at 64 heads
    BK = max(min_dot, min(128, next_power_of_2(K)))
    if pdl is None:
        pdl = on_gpu and pdl_supported(x.device)
    early = dict(launch_pdl=True) if pdl else {}  # only when on: the interpreter does not know it
    gate_projection_kernel[(cdiv(N, BN), cdiv(M, BM))](
        rows, weight, bias, gates, M, N, K, rows.stride(0), BM=BM, BN=BN, BK=BK,
        PREC=dot_precision(x.dtype, x.device, 128), PDL=pdl, num_warps=4, num_stages=4, **early, **LAUNCH_OPTIONS,
    )  # fmt: skip
    return gates
