"""Tile-level attention math shared by the selected and sliding-window kernels.

Every kernel of those two branches is the same loop: a tile of query rows meets
a tile of keys. A query row is one (position, query head) pair; the kernels pack
the ``G`` heads of a KV group (padded to ``GP``) into the rows, so each key tile
loaded from memory serves the whole group. The helpers below are that tile
step, written once:

- :func:`attn_fwd_step`: one key tile of the online softmax (forward);
- :func:`attn_bwd_dq_step`: one key tile's contribution to ``dQ``, and
  :func:`store_scaled` to write a gradient (or add it to another branch's);
- :func:`attn_bwd_dkdv_step`: one query tile's contribution to ``dK``/``dV``.

The backward steps take an optional per-row gate ``g`` (``GATED``, rows from
:func:`load_gate`): given the gradient ``dO`` of a gated sum ``... + g * O``, the branch's
own is ``g * dO``, and scaling the probabilities instead, ``dV = (g P)^T dO`` and
``dS = (g P) * (dO V^T - rowsum(O * dO))``, gives the same gradients without a scaled
copy of ``dO`` (its tiles stay plain loads the compiler pipelines).

Conventions: scores live in the log2 domain (``qk_scale = scale * log2(e)``, so
``exp2`` replaces ``exp``), and the saved ``lse`` is ``log2(sum(exp2(s)))`` in
float32 (``-inf`` for a row that sees nothing). Accumulators are float32; the
second operand of each dot is cast to the input dtype, as flash attention does.
A ``MASK`` constexpr specialises each step: tiles known to be fully visible skip
the mask, only edge tiles pay for it.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from nsa import flags
from nsa.ops._triton.device import device_memory, large_shared_memory, small_shared_memory
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2

#: exp(x) == exp2(x * LOG2E): folding LOG2E into the softmax scale lets kernels use exp2.
LOG2E = 1.4426950408889634


def next_pow2(n: int, minimum: int = 16) -> int:
    """Smallest power of two >= ``max(n, minimum)``: tile sizes must be powers of
    two and ``tl.dot`` needs every dimension >= 16."""
    return max(minimum, next_power_of_2(n))


#: ``tl.dot`` precision for float32 inputs at each ``torch.get_float32_matmul_precision()``,
#: each at least as precise as torch promises for its own matmuls there: "highest" exact float32
#: (``ieee``: multiply-adds, no tensor cores); "high" TF32 or two bfloat16s, about 16 mantissa
#: bits (``tf32x3``: three TF32 products, about 21 bits, on tensor cores); "medium" bfloat16
#: (``tf32``: one TF32 product, 10 bits).
FLOAT32_DOT_BY_TORCH_PRECISION = {"highest": "ieee", "high": "tf32x3", "medium": "tf32"}


def dot_precision(dtype: torch.dtype, device: torch.device, head_dim: int) -> str:
    """``input_precision`` of ``tl.dot`` for inputs of ``dtype`` on ``device``, heads of
    ``head_dim`` (the wider of the key and value heads).

    16-bit inputs: irrelevant (``"tf32"``, Triton's default). float32: ``NSA_FLOAT32_DOT``, whose
    default ``auto`` follows ``torch.get_float32_matmul_precision()``
    (:data:`FLOAT32_DOT_BY_TORCH_PRECISION`): exact ``ieee`` at torch's default "highest". The
    tensor-core precisions apply where their launches are sized (:func:`pipeline_stages`): heads up to
    128 wide on a GPU with Hopper's shared memory. Elsewhere the products stay ``ieee``: float32
    tiles of 192-wide heads asked 256-384 KiB of an H100's 227 (session 26), and compiled for an
    A100 the dK/dV kernels would ask 176 KiB of its 163."""
    if dtype != torch.float32:
        return "tf32"
    choice = flags.get("NSA_FLOAT32_DOT")
    if choice == "auto":
        choice = FLOAT32_DOT_BY_TORCH_PRECISION.get(torch.get_float32_matmul_precision(), "ieee")
    if choice != "ieee" and not (head_dim <= 128 and large_shared_memory(device)):
        choice = "ieee"
    return choice


def exact_float32(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether launches for inputs of ``dtype`` multiply float32 tiles exactly (``ieee``,
    :func:`dot_precision`); they then take tiles of their own (:func:`exact_float32_tiles`)."""
    return dtype == torch.float32 and dot_precision(dtype, device, head_dim) == "ieee"


def exact_float32_tiles(dtype: torch.dtype, device: torch.device, head_dim: int) -> Optional[dict]:
    """:data:`EXACT_FLOAT32_TILES` where launches for ``dtype`` on ``device`` multiply float32
    exactly (:func:`exact_float32`), for heads ``head_dim`` wide (the wider of the key and value
    heads): twice the warps past 128, as the selected kernels take for any input (at 192/128 the
    window backward's 4 warps kept 0.5-8.8 KB stacks a thread, 8 none; sm_90 compiles). None
    where the products are not exact float32."""
    if not exact_float32(dtype, device, head_dim):
        return None
    tiles = dict(EXACT_FLOAT32_TILES)
    if head_dim > 128:
        tiles["num_warps"] *= 2
    return tiles


#: Launch options of every prefill kernel with tile products where float32 is multiplied exactly
#: (:func:`exact_float32`): ``rows`` query rows (positions times the group's padded heads) and
#: ``num_warps`` a program (heads up to 128 wide: :func:`exact_float32_tiles` doubles them for
#: wider ones), key tiles of ``BN`` tokens where a kernel's key tile is free (a selection block
#: where it walks blocks), ``num_stages``. Triton compiles exact products to multiply-adds whose
#: operands sit in registers. At the tiles tuned for 16-bit inputs (64 rows, 64 keys, 4 warps)
#: every such kernel spilled 8-14 KB a thread, compiled in 20-200 s and asked up to 145 KiB of
#: shared memory, past a consumer GPU's 99; at these, the stacks take 0-1.7 KB, the compiles 3-36 s
#: and shared memory at most 84 KiB (sm_90, head dim 128; docs/perf/float32.md, session 30). The
#: selected forward takes one stage (two ask 136 KiB with bulk copies); the decode keeps its own
#: tiles and takes one stage in both its passes.
EXACT_FLOAT32_TILES = dict(rows=16, BN=32, num_warps=4, num_stages=2)


def pipeline_stages(stages: Optional[int], dtype: torch.dtype, device: torch.device, head_dim: int, *,
                    wide_heads_one_stage: bool = False) -> Optional[int]:
    """A launch's pipeline stages: ``stages`` as tuned (None or 0 too: the launcher's default), or 1
    where the tuned tiles would not fit the GPU's shared memory otherwise (compiles of every launch
    for each shipped GPU, ``scripts/launch_resources.py``):

    - float32 tiles multiplied on tensor cores (``tf32``/``tf32x3``, :func:`dot_precision`): their
      4-byte operands, and for ``tf32x3`` the split halves beside them, sit in shared memory; two
      stages of the tiles tuned for 16-bit inputs (64 rows, 64 keys, head dim 128) ask 256 KiB,
      past an H100's 227, one asks 192;
    - ``wide_heads_one_stage`` launches where :func:`wide_heads_on_small_gpu`: the launchers pass
      it where two stages ask 104-112 KiB there and one fits (sm_89 compiles: the dQ kernels, the
      compressed forward). The dK/dV kernels and the forced blocks' dQ take smaller tiles instead."""
    if dtype == torch.float32 and dot_precision(dtype, device, head_dim) != "ieee":
        return 1
    if wide_heads_one_stage and wide_heads_on_small_gpu(head_dim, device):
        return 1
    return stages


def wide_heads_on_small_gpu(head_dim: int, device: torch.device) -> bool:
    """Whether heads wider than 128 (tiles padded to 256) meet a GPU with less than 128 KiB of
    shared memory a program (:func:`small_shared_memory`: an RTX 4090's or 3090's 99). The
    backward launches tuned for 16-bit heads then ask 104-112 KiB (sm_89 compiles,
    docs/perf/other_gpus.md), and take one stage or smaller tiles."""
    return head_dim > 128 and small_shared_memory(device)


def hopper_tiles_fit(dtype: torch.dtype, head_dim: int, device: torch.device) -> bool:
    """Whether the deeper pipelines and wider tiles tuned on Hopper fit: 16-bit inputs, heads up
    to 128 wide, and Hopper-sized shared memory per program (:func:`large_shared_memory`)."""
    if dtype == torch.float32 or head_dim > 128:
        return False
    return large_shared_memory(device)


def dq_from_ds_budget(flag: str, device: torch.device) -> int:
    """Bytes a branch's backward may fill with its dK/dV kernel's ``dS`` so that its dQ reads
    ``dS`` instead of recomputing the softmax: the MiB of the NSA_ flag ``flag``, or for -1 an
    eighth of the GPU's memory (4 GiB on the CPU)."""
    mib = flags.get(flag)
    if mib >= 0:
        return mib * 2**20
    return device_memory(device) // 8


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dim has stride 1 (kernels take the other strides as
    arguments), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def check_gate(gate: Optional[torch.Tensor], rows: Tuple[int, int, int]) -> bool:
    """Whether a branch backward gets a gate (``GATED``), after checking it: a contiguous
    float32 ``[B, T, HQ]`` tensor. The kernels load it beside ``lse`` in every step; a 16-bit
    or strided gate (a column of ``gates [B, T, HQ, 3]``) cannot go through the pipelined
    copies, and cost 30 % of the compressed backward at 64k (H100, docs/perf/prefill.md)."""
    if gate is None:
        return False
    if tuple(gate.shape) != tuple(rows):
        raise ValueError(f"gate must be [B, T, HQ] = {list(rows)}, got {list(gate.shape)}")
    if gate.dtype != torch.float32 or not gate.is_contiguous():
        raise ValueError(f"gate must be contiguous float32, got {gate.dtype} with strides {gate.stride()}")
    return True


def describable(t: torch.Tensor) -> bool:
    """Whether a bulk-copy (TMA) descriptor can describe ``t`` as it is: a 16-byte aligned base
    and non-zero strides that are multiples of 16 bytes."""
    unit = 16 // t.element_size()
    return t.data_ptr() % 16 == 0 and all(s > 0 and s % unit == 0 for s in t.stride()[:-1])


def descriptor_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if a descriptor can describe it (:func:`describable`), else a contiguous copy."""
    return t if describable(t) else t.contiguous()


def token_tile_descriptor(t: torch.Tensor, tokens: int, width: int) -> TensorDescriptor:
    """Descriptor of a ``[B, T, H, D]`` tensor whose block is ``tokens`` tokens of one head,
    ``width >= D`` wide (the copy fills the columns past ``D``, and the tokens past ``T``, with zeros);
    kernels read it with :func:`token_tile`."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, tokens, 1, width])


@triton.jit
def token_tile(d, i_b, t0, i_h, TOKENS: tl.constexpr, WIDTH: tl.constexpr):
    """``[TOKENS, WIDTH]``: tokens ``t0 ..`` of head ``i_h`` of sequence ``i_b``, one bulk copy
    through a :func:`token_tile_descriptor` (offsets are 32-bit)."""
    return d.load([i_b, t0, i_h, 0]).reshape(TOKENS, WIDTH)


@triton.jit
def head_columns(DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Columns of a key row and of a value row padded to ``BK``/``BV``, and their masks
    (``< DK``, ``< DV``): ``(o_dk, o_dv, m_dk, m_dv)``."""
    o_dk, o_dv = tl.arange(0, BK), tl.arange(0, BV)
    return o_dk, o_dv, o_dk < DK, o_dv < DV


@triton.jit
def kv_head_bases(k, v, i_b, i_h, skb, skh, svb, svh):
    """``k`` and ``v`` (``[B, T, H, D]``, strides ``skb``/``skh``, ``svb``/``svh``) at sequence
    ``i_b`` and KV head ``i_h``, in 64-bit offsets."""
    return k + i_b.to(tl.int64) * skb + i_h.to(tl.int64) * skh, v + i_b.to(tl.int64) * svb + i_h.to(tl.int64) * svh


@triton.jit
def row_offsets(i_b, o_i, o_head, stride_b, stride_t, stride_h):
    """int64 element offsets of rows ``(batch i_b, position o_i, head o_head)`` of a
    ``[B, T, heads, D]`` tensor; 64-bit so that 128k+ tokens never overflow."""
    return i_b.to(tl.int64) * stride_b + o_i.to(tl.int64) * stride_t + o_head.to(tl.int64) * stride_h


@triton.jit
def load_gate(gate, o_row, m_row, GATED: tl.constexpr):
    """``[BM]`` gates of the flat ``[B * T * HQ]`` rows ``o_row`` (float32, see
    :func:`check_gate`); without ``GATED`` nothing is read and the result is a placeholder
    that the steps ignore."""
    if GATED:
        b_g = tl.load(gate + o_row, mask=m_row, other=0.0)
    else:
        b_g = m_row.to(tl.float32)
    return b_g


@triton.jit
def load_bwd_rows(
    q, do, gate, lse, delta, i_b, o_i, o_hq, m_r,  #
    sqb, sqt, sqh, sdb, sdt, sdh, o_dk, o_dv, m_dk, m_dv, T, HQ: tl.constexpr, GATED: tl.constexpr,
):
    """What a backward step needs of its rows (batch ``i_b``, positions ``o_i``, query heads
    ``o_hq``, ``m_r`` the real ones): ``q [BM, BK]`` and ``do [BM, BV]`` (zeros in padding rows),
    the gates, lse and delta ``[BM]`` (:func:`load_gate`), and the rows' offsets ``o_row`` into
    the flat ``[B * T * HQ]`` row tensors."""
    b_q = tl.load(q + row_offsets(i_b, o_i, o_hq, sqb, sqt, sqh)[:, None] + o_dk[None, :], mask=m_r[:, None] & m_dk[None, :], other=0.0)
    b_do = tl.load(do + row_offsets(i_b, o_i, o_hq, sdb, sdt, sdh)[:, None] + o_dv[None, :], mask=m_r[:, None] & m_dv[None, :], other=0.0)
    o_row = row_offsets(i_b, o_i, o_hq, T * HQ, HQ, 1)
    b_g = load_gate(gate, o_row, m_r, GATED)
    b_lse = tl.load(lse + o_row, mask=m_r, other=0.0)
    b_delta = tl.load(delta + o_row, mask=m_r, other=0.0)
    return b_q, b_do, b_g, b_lse, b_delta, o_row


@triton.jit
def attn_fwd_step(b_q, b_k, b_v, b_acc, b_m, b_l, m_qk, qk_scale, MASK: tl.constexpr, PREC: tl.constexpr):
    """Online-softmax update with one key tile.

    Args:
        b_q: ``[BM, BK]`` query rows; b_k: ``[BN, BK]``; b_v: ``[BN, BV]``.
        b_acc: ``[BM, BV]`` float32 unnormalised output; b_m, b_l: ``[BM]`` running
            max (log2 domain, ``-inf`` while nothing is seen) and sum.
        m_qk: ``[BM, BN]`` visibility, read only when ``MASK``.

    Returns:
        the updated ``(b_acc, b_m, b_l)``.
    """
    # -- raw scores; the log2-domain scale (> 0) is applied to the row max and inside the
    # exponent's fused multiply-add, which saves a multiply per score (max(s) * c == max(s * c)
    # for c > 0 under any rounding, so the results are bitwise those of scaling first) --
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)  # [BM, BN]
    if MASK:
        b_s = tl.where(m_qk, b_s, float("-inf"))
    # -- online softmax; a row that has seen nothing shifts by 0 so exp2 never sees -inf - -inf --
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1) * qk_scale)
    b_shift = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_p = tl.exp2(b_s * qk_scale - b_shift[:, None])  # [BM, BN]
    b_alpha = tl.exp2(b_m - b_shift)  # [BM]
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PREC)  # [BM, BV]
    return b_acc, b_m_new, b_l


@triton.jit
def attn_fwd_finish(b_acc, b_m, b_l):
    """``(o [BM, BV], lse [BM])`` from the accumulators: a row that saw nothing gets
    ``o = 0`` and ``lse = -inf``."""
    m_any = b_l > 0
    b_o = b_acc / tl.where(m_any, b_l, 1.0)[:, None]
    b_lse = tl.where(m_any, b_m + tl.log2(tl.where(m_any, b_l, 1.0)), float("-inf"))
    return b_o, b_lse


@triton.jit
def attn_bwd_dq_step(
    b_q, b_do, b_lse, b_delta, b_g, b_k, b_v, b_dq, m_qk, qk_scale,
    MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
):
    """``dQ`` (unscaled) += one key tile's share.

    Args:
        b_q: ``[BM, BK]``; b_do: ``[BM, BV]``; b_lse, b_delta: ``[BM]`` (log2-domain
            lse and ``rowsum(o * do)``); b_g: ``[BM]`` gates, read when ``GATED``;
            b_k: ``[BN, BK]``; b_v: ``[BN, BV]``; b_dq: ``[BM, BK]`` float32;
        m_qk: ``[BM, BN]`` visibility when ``MASK``.
    """
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * qk_scale  # [BM, BN]
    b_p = tl.exp2(b_s - b_lse[:, None])
    if MASK:
        # where() rather than -inf scores: a row with lse = -inf must give 0, not inf * 0
        b_p = tl.where(m_qk, b_p, 0.0)
    b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=PREC)  # [BM, BN]
    b_ds = attn_bwd_ds(b_p, b_dp, b_delta, b_g, GATED)
    b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=PREC)  # [BM, BK]
    return b_dq


@triton.jit
def attn_bwd_ds(b_p, b_dp, b_delta, b_g, GATED: tl.constexpr):
    """``dS = P (dP - delta)`` of rows ``[BM, BN]``, times the rows' gates ``b_g`` with ``GATED``."""
    if GATED:
        # g P (dP - delta) as P (g dP - g delta): one fused multiply-add a score instead of
        # a multiply and a subtraction
        return b_p * (b_dp * b_g[:, None] - (b_g * b_delta)[:, None])
    return b_p * (b_dp - b_delta[:, None])


@triton.jit
def store_scaled(p_out, b_grad, scale, mask, ADD: tl.constexpr):
    """Store a gradient tile ``b_grad * scale`` (float32) at ``p_out`` in its dtype; with ``ADD``,
    plus what ``p_out`` held (another kernel's share of the same gradient), rounded once."""
    b_grad = b_grad * scale
    if ADD:
        b_grad += tl.load(p_out, mask=mask, other=0.0).to(tl.float32)
    tl.store(p_out, b_grad.to(p_out.dtype.element_ty), mask=mask)


@triton.jit
def attn_bwd_dkdv_step(
    b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq, qk_scale,
    MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
):
    """``dK`` (unscaled) and ``dV`` += one query tile's share, in transposed form.

    Args:
        b_k: ``[BN, BK]``; b_v: ``[BN, BV]``; b_q: ``[BM, BK]``; b_do: ``[BM, BV]``;
        b_lse, b_delta: ``[BM]``; b_g: ``[BM]`` gates, read when ``GATED``;
        b_dk: ``[BN, BK]`` and b_dv: ``[BN, BV]`` float32;
        m_kq: ``[BN, BM]`` visibility when ``MASK``. Padding rows must carry
        ``q = do = 0`` and a finite lse so that they add exactly zero.
    """
    b_dk, b_dv, _ = attn_bwd_dkdv_ds_step(b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq, qk_scale, MASK,
                                          GATED, PREC)
    return b_dk, b_dv


@triton.jit
def attn_bwd_dkdv_ds_step(
    b_k, b_v, b_q, b_do, b_lse, b_delta, b_g, b_dk, b_dv, m_kq, qk_scale,
    MASK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
):
    """:func:`attn_bwd_dkdv_step` that also returns the tile's ``dS^T [BN, BM]`` (float32,
    unscaled, gated), from which ``dQ = scale * dS K`` needs no softmax of its own."""
    b_st = tl.dot(b_k, tl.trans(b_q), input_precision=PREC) * qk_scale  # [BN, BM]
    b_pt = tl.exp2(b_st - b_lse[None, :])
    if MASK:
        b_pt = tl.where(m_kq, b_pt, 0.0)
    if GATED:
        b_pt = b_pt * b_g[None, :]
    b_dv += tl.dot(b_pt.to(b_do.dtype), b_do, input_precision=PREC)  # [BN, BV]
    b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=PREC)  # [BN, BM]
    b_dst = b_pt * (b_dpt - b_delta[None, :])
    b_dk += tl.dot(b_dst.to(b_q.dtype), b_q, input_precision=PREC)  # [BN, BK]
    return b_dk, b_dv, b_dst


@triton.jit
def attn_bwd_delta_kernel(o, do, delta, ROWS, sob, sot, soh, sdb, sdt, sdh, T, HQ, DV: tl.constexpr, BR: tl.constexpr, BV: tl.constexpr):
    """Grid ``(cdiv(ROWS, BR),)``: ``delta[r] = sum(o[r] * do[r])`` in float32 for the
    ``ROWS = B * T * HQ`` rows of ``[B, T, HQ, DV]`` tensors (one read of each, no
    float32 copies)."""
    o_r = tl.program_id(0) * BR + tl.arange(0, BR)
    m_r = o_r < ROWS
    i_b, i_t, i_h = o_r // (T * HQ), (o_r // HQ) % T, o_r % HQ
    o_d = tl.arange(0, BV)
    m = m_r[:, None] & (o_d < DV)[None, :]
    b_o = tl.load(o + row_offsets(i_b, i_t, i_h, sob, sot, soh)[:, None] + o_d[None, :], mask=m, other=0.0)  # [BR, BV]
    b_do = tl.load(do + row_offsets(i_b, i_t, i_h, sdb, sdt, sdh)[:, None] + o_d[None, :], mask=m, other=0.0)
    tl.store(delta + o_r.to(tl.int64), tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), 1), mask=m_r)


def attn_bwd_delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """``rowsum(o * do)``: float32 ``[B, T, HQ]`` for ``o``, ``do`` ``[B, T, HQ, DV]`` (stride 1 in DV)."""
    B, T, HQ, DV = o.shape
    delta = torch.empty(B, T, HQ, device=o.device, dtype=torch.float32)
    rows = B * T * HQ
    BV = next_pow2(DV)
    BR = max(1, 8192 // BV)
    attn_bwd_delta_kernel[(cdiv(rows, BR),)](
        o, do, delta, rows, *o.stride()[:3], *do.stride()[:3], T, HQ, DV=DV, BR=BR, BV=BV, num_warps=8,
        **LAUNCH_OPTIONS,
    )
    return delta
