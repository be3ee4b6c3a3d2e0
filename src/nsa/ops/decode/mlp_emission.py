"""A decode step's compressed-token emission through the learnable compression, in two launches.

Every graph-safe step recomputes the newest compressed token of each sequence
(:meth:`nsa.NSACache.emit`): gather its raw block, add the intra-block position embedding, run
the MLP of :class:`nsa.modules.MLPCompression` (``Linear``, exact GELU, ``Linear``), store the
token. In PyTorch that is twelve launches for keys and values together (the gather, two
additions, four products, two split-K reductions, two GELUs, the store), about 31 us of the
104.5-us :class:`nsa.DecodeGraph` step profiled in session 39, each of them far too small to
fill the GPU (benchmark layer, batch 1, H200; docs/perf/compile.md). Here:

- :func:`mlp_hidden_kernel`: program ``(hidden tile, split, row tile and source)`` gathers
  ``SPLIT_POSITIONS`` positions of its rows' blocks, adds the position embedding and multiplies
  them by its tile of the first weight: float32 partial sums ``[2, splits, rows, hidden]``. The
  split over the block's positions gives the launch enough programs to read the weights
  (2 MiB a source at head dim 128) at speed.
- :func:`mlp_out_kernel`: program ``(row tile, source, output tile)`` sums the partials in a
  fixed order (deterministic), adds the bias, applies GELU, multiplies by the second weight, adds
  its bias and stores the token into the compressed buffer at its slot.

A row is one head of one new token, ``((b * count + c) * H + h)``. Values are rounded where
PyTorch's modules round them (the sum with the embedding, each product's output, GELU's), so
the tokens differ from the modules' only in the products' order of summation.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import torch
import triton
import triton.language as tl

from nsa.config import NSAConfig
from nsa.ops._triton.attention import dot_precision
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2
from nsa.ops.decode.cache_write import newest_slot

#: rows (new tokens times KV heads) up to which :meth:`nsa.NSACache.emit` takes these launches:
#: past it (a packed prefill's emission) the partial sums grow with the rows, and cuBLAS's
#: products are the better tool
MAX_ROWS = 1024

#: positions of a block each program of the first launch multiplies (at most: a divisor of
#: ``cmp_block``, so that no program's share runs past the block)
SPLIT_POSITIONS = 4

#: pipeline stages of the first launch (1: its loop over the positions unrolled)
HIDDEN_STAGES = 1

#: the second launch: hidden units it sums at a time, whether its loop over them is unrolled, its
#: pipeline stages and warps (8: four warps held every split's partial sums in 255 registers and
#: spilled, compiled for sm_90)
SUM_TILE, UNROLL_SUMS, SUM_STAGES, SUM_WARPS = 64, True, 3, 4


class MLPWeights(NamedTuple):
    """One learnable compression's parameters: ``pos_emb [l, D]``, ``w1 [hidden, l * D]``,
    ``b1 [hidden]``, ``w2 [D, hidden]``, ``b2 [D]`` (the two ``nn.Linear`` layers' weights and
    biases)."""

    pos_emb: torch.Tensor
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor


@triton.jit
def _rows_and_slots(last, stride_last, i_m, ROWS, COUNT, H, CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr,
                    BM: tl.constexpr):
    """Row tile ``i_m``'s rows, their mask, sequences, heads and compressed-token slots."""
    r = i_m.to(tl.int64) * BM + tl.arange(0, BM)
    in_rows = r < ROWS
    token, h = r // H, r % H  # token = b * COUNT + c
    b, c = token // COUNT, token % COUNT
    slot = newest_slot(tl.load(last + b * stride_last, mask=in_rows, other=0).to(tl.int64), c, COUNT,
                       CMP_BLOCK, CMP_STRIDE)  # fmt: skip
    return r, in_rows, b, h, slot


@triton.jit
def _position_product(acc, src, pos_emb, w1, b, h, slot, in_rows, d, in_d, j, in_j, p, CAPACITY, H, D,
                      CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, PREC: tl.constexpr):
    """``acc`` plus block position ``p`` of the rows' blocks, with its position embedding and
    rounded as PyTorch's sum is, times its columns of the first weight (units ``j``)."""
    # only a block not complete yet (invisible to every query) reaches past the capacity
    position = tl.minimum(slot * CMP_STRIDE + p, CAPACITY - 1)
    x = tl.load(src + ((b * CAPACITY + position) * H + h)[:, None] * D + d[None, :],
                mask=in_rows[:, None] & in_d[None, :], other=0.0)  # fmt: skip
    emb = tl.load(pos_emb + p * D + d, mask=in_d, other=0.0)
    x = (x.to(tl.float32) + emb.to(tl.float32)[None, :]).to(src.dtype.element_ty)
    w = tl.load(w1 + j[:, None].to(tl.int64) * (CMP_BLOCK * D) + p * D + d[None, :],
                mask=in_j[:, None] & in_d[None, :], other=0.0)  # fmt: skip
    return tl.dot(x, tl.trans(w), acc, input_precision=PREC)


@triton.jit
def mlp_hidden_kernel(
    last, stride_last, k_raw, v_raw, pos_k, pos_v, w1_k, w1_v, partial,
    ROWS, COUNT, CAPACITY, H, HID_K, HID_V, HID_MAX,
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BJ: tl.constexpr, BD: tl.constexpr, SPLIT_POSITIONS: tl.constexpr, UNROLL: tl.constexpr,
    PREC: tl.constexpr,
):
    i_j, i_s, i_mw = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_m, which = i_mw // 2, i_mw % 2
    if which == 0:
        src, pos_emb, w1 = k_raw, pos_k, w1_k
    else:
        src, pos_emb, w1 = v_raw, pos_v, w1_v
    D, HID = tl.where(which == 0, DK, DV), tl.where(which == 0, HID_K, HID_V)
    if i_j * BJ < HID:  # the narrower source's surplus hidden tiles have nothing to do
        r, in_rows, b, h, slot = _rows_and_slots(last, stride_last, i_m, ROWS, COUNT, H, CMP_BLOCK, CMP_STRIDE, BM)
        d = tl.arange(0, BD)
        in_d = d < D
        j = i_j * BJ + tl.arange(0, BJ)
        in_j = j < HID
        acc = tl.zeros([BM, BJ], dtype=tl.float32)
        if UNROLL:  # every position's loads issued before the first product waits on them
            for p0 in tl.static_range(SPLIT_POSITIONS):
                acc = _position_product(acc, src, pos_emb, w1, b, h, slot, in_rows, d, in_d, j, in_j,
                                        i_s * SPLIT_POSITIONS + p0, CAPACITY, H, D, CMP_BLOCK, CMP_STRIDE, PREC)  # fmt: skip
        else:  # a loop that Triton pipelines
            for p0 in range(SPLIT_POSITIONS):
                acc = _position_product(acc, src, pos_emb, w1, b, h, slot, in_rows, d, in_d, j, in_j,
                                        i_s * SPLIT_POSITIONS + p0, CAPACITY, H, D, CMP_BLOCK, CMP_STRIDE, PREC)  # fmt: skip
        n_splits = tl.num_programs(1)
        out = partial + ((which * n_splits + i_s) * ROWS + r)[:, None] * HID_MAX + j[None, :]
        tl.store(out, acc, mask=in_rows[:, None] & in_j[None, :])


@triton.jit
def _hidden_chunk_product(acc, partial, b1, w2, which, r, in_rows, n, in_n, k0, HID, HID_MAX, ROWS,
                          BM: tl.constexpr, BH: tl.constexpr, SPLITS: tl.constexpr, PREC: tl.constexpr):
    """``acc`` plus hidden units ``[k0, k0 + BH)`` of rows ``r`` times their columns of the second
    weight: the first product's partial sums added in split order (whatever order their programs
    ran in) and its bias, rounded as ``nn.Linear`` returns them, then exact GELU in float32, rounded
    again. Units past ``HID`` (the narrower source's surplus) count zero."""
    k = k0 + tl.arange(0, BH)
    in_k = k < HID
    pre = tl.zeros([BM, BH], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        pre += tl.load(partial + ((which * SPLITS + s) * ROWS + r)[:, None] * HID_MAX + k[None, :],
                       mask=in_rows[:, None] & in_k[None, :], other=0.0)  # fmt: skip
    dtype = w2.dtype.element_ty
    pre = (pre + tl.load(b1 + k, mask=in_k, other=0.0).to(tl.float32)[None, :]).to(dtype).to(tl.float32)
    hidden = (0.5 * pre * (1.0 + tl.math.erf(pre * 0.7071067811865476))).to(dtype)
    w = tl.load(w2 + n[:, None] * HID + k[None, :], mask=in_n[:, None] & in_k[None, :], other=0.0)
    return tl.dot(hidden, tl.trans(w), acc, input_precision=PREC)


@triton.jit
def mlp_out_kernel(
    last, stride_last, partial, b1_k, b1_v, w2_k, w2_v, b2_k, b2_v, k_cmp, v_cmp,
    ROWS, COUNT, CMP_CAPACITY, H, HID_K, HID_V, HID_MAX,
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BH: tl.constexpr, CHUNKS: tl.constexpr, SPLITS: tl.constexpr,
    UNROLL: tl.constexpr, PREC: tl.constexpr,
):
    i_m, which, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if which == 0:
        b1, w2, b2, dst = b1_k, w2_k, b2_k, k_cmp
    else:
        b1, w2, b2, dst = b1_v, w2_v, b2_v, v_cmp
    D, HID = tl.where(which == 0, DK, DV), tl.where(which == 0, HID_K, HID_V)
    if i_n * BN < D:
        r, in_rows, b, h, slot = _rows_and_slots(last, stride_last, i_m, ROWS, COUNT, H, CMP_BLOCK, CMP_STRIDE, BM)
        n = i_n * BN + tl.arange(0, BN)
        in_n = n < D
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        if UNROLL:  # every chunk's partial sums read in one round trip, in more registers
            for chunk in tl.static_range(CHUNKS):
                acc = _hidden_chunk_product(acc, partial, b1, w2, which, r, in_rows, n, in_n, chunk * BH, HID, HID_MAX,
                                            ROWS, BM, BH, SPLITS, PREC)  # fmt: skip
        else:
            for chunk in range(CHUNKS):
                acc = _hidden_chunk_product(acc, partial, b1, w2, which, r, in_rows, n, in_n, chunk * BH, HID, HID_MAX,
                                            ROWS, BM, BH, SPLITS, PREC)  # fmt: skip
        token = acc + tl.load(b2 + n, mask=in_n, other=0.0).to(tl.float32)[None, :]
        tl.store(dst + ((b * CMP_CAPACITY + slot) * H + h)[:, None] * D + n[None, :],
                 token.to(dst.dtype.element_ty), mask=in_rows[:, None] & in_n[None, :])  # fmt: skip


def _check_weights(name: str, weights: MLPWeights, raw: torch.Tensor, config: NSAConfig) -> int:
    """The hidden width of ``weights``, checked against ``raw``'s heads and dtype."""
    D, l = raw.shape[3], config.cmp_block
    hidden = weights.b1.shape[0]
    want = {"pos_emb": (l, D), "w1": (hidden, l * D), "b1": (hidden,), "w2": (D, hidden), "b2": (D,)}
    for field, shape in want.items():
        t = getattr(weights, field)
        if tuple(t.shape) != shape or t.dtype != raw.dtype or t.device != raw.device or not t.is_contiguous():
            raise ValueError(f"{name}.{field} must be a contiguous {raw.dtype} {list(shape)} on {raw.device}, "
                             f"got {t.dtype} {list(t.shape)} on {t.device}")  # fmt: skip
    return hidden


def emit_mlp_tokens(
    k_raw: torch.Tensor, v_raw: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, last: torch.Tensor,
    count: int, config: NSAConfig, weights: Sequence[MLPWeights], *, split_positions: Optional[int] = None,
    hidden_tile: Optional[int] = None, sum_tile: Optional[int] = None, out_tile: Optional[int] = None,
    unroll: Optional[bool] = None, sum_stages: Optional[int] = None, sum_warps: Optional[int] = None,
    hidden_stages: Optional[int] = None,
) -> None:
    """``k_cmp``/``v_cmp [B, cmp capacity, H, D]`` get the ``count`` newest compressed tokens
    complete at positions ``last [B]``, each made by the learnable compression whose parameters
    are ``weights = (keys', values')`` from its raw block of contiguous ``k_raw``/``v_raw
    [B, capacity, H, D]``: the slots and clamped positions of
    :func:`nsa.ops.decode.cache_write.gather_cmp_blocks`, the tokens of
    :class:`nsa.modules.MLPCompression` (up to the products' order of summation).

    Overrides of the launches' sizes (for tests and tuning): ``split_positions`` (block positions
    a program of the first launch multiplies; made a divisor of ``cmp_block``), ``hidden_tile``
    (its hidden units), ``sum_tile`` (hidden units the second launch sums and multiplies at a
    time), ``out_tile`` (output units of a second-launch program), ``unroll`` (the second
    launch's loop over the hidden units unrolled) and ``sum_stages`` (its pipeline stages: past
    1, Triton stages the partial sums of the next units in shared memory, as many bytes as
    ``(stages - 1) * splits * 16 * sum_tile * 4``) and ``sum_warps`` (its warps);
    ``hidden_stages`` (the first launch's pipeline stages: from 2 on, its loop over the positions is
    pipelined, else unrolled)."""
    B, capacity, H = k_raw.shape[:3]
    rows = B * count * H
    if rows == 0:
        return
    DK, DV = k_raw.shape[3], v_raw.shape[3]
    hid_k = _check_weights("weights[0]", weights[0], k_raw, config)
    hid_v = _check_weights("weights[1]", weights[1], v_raw, config)
    hid_max = max(hid_k, hid_v)
    on_gpu = k_raw.device.type == "cuda"
    min_dot = 16 if on_gpu else 1  # a tl.dot's every side is at least 16 on a GPU
    prec = dot_precision(k_raw.dtype, k_raw.device, max(DK, DV))
    exact = prec == "ieee" and k_raw.dtype == torch.float32  # exact float32 products hold tiles in registers
    BM = max(min_dot, min(64, next_power_of_2(rows)))  # the first launch's rows: each reads its weights once
    BM_SUM = max(min_dot, min(16, next_power_of_2(rows)))  # the second's: each holds every split in registers
    BD = max(min_dot, next_power_of_2(max(DK, DV)))
    BJ = max(min_dot, min(hidden_tile or (32 if exact else 64), next_power_of_2(hid_max)))
    BN = max(min_dot, min(out_tile or 64, next_power_of_2(max(DK, DV))))
    BH = max(min_dot, min(sum_tile or SUM_TILE, next_power_of_2(hid_max)))
    split_positions = math.gcd(config.cmp_block, split_positions or SPLIT_POSITIONS)
    splits = config.cmp_block // split_positions
    partial = torch.empty(2, splits, rows, hid_max, dtype=torch.float32, device=k_raw.device)
    common = dict(CMP_BLOCK=config.cmp_block, CMP_STRIDE=config.cmp_stride, DK=DK, DV=DV, PREC=prec, **LAUNCH_OPTIONS)
    (k_w, v_w) = weights
    mlp_hidden_kernel[(cdiv(hid_max, BJ), splits, cdiv(rows, BM) * 2)](
        last, last.stride(0), k_raw, v_raw, k_w.pos_emb, v_w.pos_emb, k_w.w1, v_w.w1, partial,
        rows, count, capacity, H, hid_k, hid_v, hid_max, BM=BM, BJ=BJ, BD=BD, SPLIT_POSITIONS=split_positions,
        UNROLL=(hidden_stages or HIDDEN_STAGES) == 1, num_warps=4, num_stages=hidden_stages or HIDDEN_STAGES, **common,
    )  # fmt: skip
    mlp_out_kernel[(cdiv(rows, BM_SUM), 2, cdiv(max(DK, DV), BN))](
        last, last.stride(0), partial, k_w.b1, v_w.b1, k_w.w2, v_w.w2, k_w.b2, v_w.b2, k_cmp, v_cmp,
        rows, count, k_cmp.shape[1], H, hid_k, hid_v, hid_max, BN=BN, BH=BH, CHUNKS=cdiv(hid_max, BH), SPLITS=splits,
        BM=BM_SUM, UNROLL=UNROLL_SUMS if unroll is None else unroll, num_stages=sum_stages or SUM_STAGES,
        num_warps=sum_warps or SUM_WARPS, **common,
    )  # fmt: skip
