"""A decode step's compressed-token emission through the learnable compression, in three launches.

Every graph-safe step recomputes the newest compressed token of each sequence
(:meth:`nsa.NSACache.emit`): gather its raw block, add the intra-block position embedding, run
the MLP of :class:`nsa.modules.MLPCompression` (``Linear``, exact GELU, ``Linear``), store the
token. In PyTorch that is twelve launches for keys and values together (the gather, two
additions, four products, two split-K reductions, two GELUs, the store), about 31 us of the
104.5-us :class:`nsa.DecodeGraph` step profiled in session 39, each of them far too small to
fill the GPU (benchmark layer, batch 1, H200; docs/perf/compile.md). Here three launches (in
that step 5.3, 3.2 and 2.5 us; the step 0.091-0.092 -> 0.071 ms at 4k, then 0.067-0.068 with
the launches started early, session 40):

- :func:`mlp_hidden_kernel`: program ``(hidden tile, split, row tile and source)`` gathers
  ``SPLIT_POSITIONS`` positions of its rows' blocks, adds the position embedding and multiplies
  them by its tile of the first weight: float32 partial sums ``[2, splits, rows, hidden]``. The
  split over the block's positions gives the launch enough programs to read the weights
  (2 MiB a source at head dim 128) at speed.
- :func:`mlp_share_kernel`: program ``(row tile, source, hidden chunk)`` sums its chunk's
  partials in a fixed order (deterministic), adds the bias, applies GELU and multiplies by the
  chunk's columns of the second weight: float32 shares of every output unit
  ``[2, chunks, rows, D]``. It reads the splits one after another for a few rows (a batch-1
  step), all at once for more (:data:`SUM_AT_ONCE_MIN_ROWS`).
- :func:`mlp_store_kernel`: program ``(row tile, source)`` adds the chunks' shares in chunk
  order and the second bias, and stores the tokens into the compressed buffer at their slots.

One launch doing the second and third launches' work (a program per output tile running every
chunk) took 14.2 us in the step, against 5.7 for the two: with one program per chunk twice as
many programs share the split sums and GELUs.

On Hopper and later each launch may start while the one before it runs (programmatic dependent
launch, ``pdl``): the first waits before reading anything (the cache write before it wrote the
rows it gathers), the second and third load their parameters first, then wait. Every program
waits, so the third launch's end implies the first's.

A row is one head of one new token, ``((b * count + c) * H + h)``. Values are rounded where
PyTorch's modules round them (the sum with the embedding, each product's output, GELU's), so
the tokens differ from the modules' only in the products' order of summation.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from nsa.config import NSAConfig
from nsa.ops._triton.attention import dot_precision
from nsa.ops._triton.device import large_shared_memory, min_dot_side, pdl_supported
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2, pdl_launch
from nsa.ops.decode.cache_write import newest_slot
from nsa.ops.decode.mlp_weights import MLPWeights

#: rows (new tokens times KV heads) up to which :meth:`nsa.NSACache.emit` takes these launches:
#: past it (a packed prefill's emission of whole prompts) the partial sums grow with the rows,
#: and the modules' products, which cuBLAS sizes for such matrices, run instead (not timed)
MAX_ROWS = 1024

#: positions of a block each program of the first launch multiplies (at most: a divisor of
#: ``cmp_block``, so that no program's share runs past the block)
SPLIT_POSITIONS = 4

#: rows from which :func:`mlp_share_kernel` reads every split's partial sums of a tile in one
#: load, in tiles of 16 rows; below, one split after another. Measured (session 39, H200) when
#: one launch summed every chunk: a DecodeGraph step, ms, batch 1 (4 rows) 0.080-0.081 against
#: 0.089 at 4k, 0.090 against 0.099 at 32k; batch 16 (64 rows) 0.120 against 0.115 at 4k
SUM_AT_ONCE_MIN_ROWS = 17


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
def mlp_hidden_kernel(
    last, stride_last, k_raw, v_raw, pos_k, pos_v, w1_k, w1_v, partial,
    ROWS, COUNT, CAPACITY, H, HID_K, HID_V, HID_MAX,
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BJ: tl.constexpr, BD: tl.constexpr, SPLIT_POSITIONS: tl.constexpr, PREC: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # the next launch may start; the cache write before this one must have ended
        gdc_launch_dependents()
        gdc_wait()
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
        for p0 in range(SPLIT_POSITIONS):
            p = i_s * SPLIT_POSITIONS + p0
            # only a block not complete yet (invisible to every query) reaches past the capacity
            position = tl.minimum(slot * CMP_STRIDE + p, CAPACITY - 1)
            x = tl.load(src + ((b * CAPACITY + position) * H + h)[:, None] * D + d[None, :],
                        mask=in_rows[:, None] & in_d[None, :], other=0.0)  # fmt: skip
            emb = tl.load(pos_emb + p * D + d, mask=in_d, other=0.0)
            x = (x.to(tl.float32) + emb.to(tl.float32)[None, :]).to(src.dtype.element_ty)  # the block + pos_emb, rounded
            w = tl.load(w1 + j[:, None].to(tl.int64) * (CMP_BLOCK * D) + p * D + d[None, :],
                        mask=in_j[:, None] & in_d[None, :], other=0.0)  # fmt: skip
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PREC)
        n_splits = tl.num_programs(1)
        out = partial + ((which * n_splits + i_s) * ROWS + r)[:, None] * HID_MAX + j[None, :]
        tl.store(out, acc, mask=in_rows[:, None] & in_j[None, :])


@triton.jit
def mlp_share_kernel(
    partial, b1_k, b1_v, w2_k, w2_v, share, ROWS, HID_K, HID_V, HID_MAX, SPLITS, D_MAX,
    DK: tl.constexpr, DV: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BH: tl.constexpr, BS: tl.constexpr,
    AT_ONCE: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
):
    # program (row tile, source, hidden chunk): hidden units [chunk * BH, + BH) of its rows, as
    # the first product's partial sums added in a fixed order (whatever order their programs ran
    # in) plus the bias, rounded as nn.Linear returns them, then exact GELU in float32, rounded
    # again; times their columns of the second weight. Units past the source's width (the
    # narrower source's surplus chunks) count zero, so those programs store zeros.
    i_m, which, i_c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if which == 0:
        b1, w2 = b1_k, w2_k
    else:
        b1, w2 = b1_v, w2_v
    D, HID = tl.where(which == 0, DK, DV), tl.where(which == 0, HID_K, HID_V)
    r = i_m.to(tl.int64) * BM + tl.arange(0, BM)
    in_rows = r < ROWS
    k = i_c * BH + tl.arange(0, BH)
    in_k = k < HID
    n = tl.arange(0, BN)
    in_n = n < D
    # the parameters first: with PDL they load while the first launch runs
    bias = tl.load(b1 + k, mask=in_k, other=0.0).to(tl.float32)
    w = tl.load(w2 + n[:, None] * HID + k[None, :], mask=in_n[:, None] & in_k[None, :], other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    if AT_ONCE:  # every split in one load (BS of them padded), then one reduction
        s = tl.arange(0, BS)[:, None, None]
        # 32-bit offsets (the partial sums hold fewer than 2**31 elements: MAX_ROWS rows)
        offsets = ((which * SPLITS + s) * ROWS + r.to(tl.int32)[None, :, None]) * HID_MAX + k[None, None, :]
        parts = tl.load(partial + offsets, mask=(s < SPLITS) & in_rows[None, :, None] & in_k[None, None, :], other=0.0)
        pre = tl.sum(parts, axis=0)
    else:  # one split after another
        pre = tl.zeros([BM, BH], dtype=tl.float32)
        for s in range(SPLITS):
            pre += tl.load(partial + ((which * SPLITS + s) * ROWS + r)[:, None] * HID_MAX + k[None, :],
                           mask=in_rows[:, None] & in_k[None, :], other=0.0)  # fmt: skip
    dtype = w2.dtype.element_ty
    pre = (pre + bias[None, :]).to(dtype).to(tl.float32)
    hidden = (0.5 * pre * (1.0 + tl.math.erf(pre * 0.7071067811865476))).to(dtype)
    out = tl.dot(hidden, tl.trans(w), input_precision=PREC)
    chunks = tl.num_programs(2)
    tl.store(share + ((which * chunks + i_c) * ROWS + r)[:, None] * D_MAX + n[None, :], out,
             mask=in_rows[:, None] & in_n[None, :])  # fmt: skip


@triton.jit
def mlp_store_kernel(
    last, stride_last, share, b2_k, b2_v, k_cmp, v_cmp,
    ROWS, COUNT, CMP_CAPACITY, H, D_MAX, CHUNKS,
    CMP_BLOCK: tl.constexpr, CMP_STRIDE: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, PDL: tl.constexpr,
):
    # program (row tile, source): the hidden chunks' shares added in chunk order (deterministic),
    # the second bias, the tokens stored at their slots
    i_m, which = tl.program_id(0), tl.program_id(1)
    if which == 0:
        b2, dst = b2_k, k_cmp
    else:
        b2, dst = b2_v, v_cmp
    D = tl.where(which == 0, DK, DV)
    n = tl.arange(0, BN)
    in_n = n < D
    bias = tl.load(b2 + n, mask=in_n, other=0.0).to(tl.float32)
    if PDL:  # even the positions: with PDL all three launches may start before they are written
        gdc_wait()
    r, in_rows, b, h, slot = _rows_and_slots(last, stride_last, i_m, ROWS, COUNT, H, CMP_BLOCK, CMP_STRIDE, BM)
    token = tl.zeros([BM, BN], dtype=tl.float32)
    for c in range(CHUNKS):
        token += tl.load(share + ((which * CHUNKS + c) * ROWS + r)[:, None] * D_MAX + n[None, :],
                         mask=in_rows[:, None] & in_n[None, :], other=0.0)  # fmt: skip
    token += bias[None, :]
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


def row_tile(rows: int, head_tile: int, dtype: torch.dtype, device: torch.device) -> int:
    """Rows of a program of :func:`emit_mlp_tokens`'s launches, for heads padded to ``head_tile``.

    The first launch stages its operands in shared memory (compiled for sm_90; 4 positions, 3
    stages): 41 KB at 16 rows and heads of 128, 82 at 64 rows; 83 KB at 16 rows and heads of 256
    (192 padded), 161 at 64; float32 132-165 KB at 64 rows, spilling. So tiles of 64 rows only where
    they fit, 16-bit heads up to 128 wide on Hopper's shared memory, else 16 (an RTX 4090 gives a
    program 99 KB); at least 16 on a GPU, whose ``tl.dot`` needs it."""
    min_dot = min_dot_side(device)
    wide = head_tile <= 128 and dtype.itemsize == 2 and large_shared_memory(device)
    return max(min_dot, min(64 if wide else 16, next_power_of_2(rows)))


def emit_mlp_tokens(
    k_raw: torch.Tensor, v_raw: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, last: torch.Tensor,
    count: int, config: NSAConfig, weights: Sequence[MLPWeights], *, pdl: Optional[bool] = None,
) -> None:
    """``k_cmp``/``v_cmp [B, cmp capacity, H, D]`` get the ``count`` newest compressed tokens
    complete at positions ``last [B]``, each made by the learnable compression whose parameters
    are ``weights = (keys', values')`` from its raw block of contiguous ``k_raw``/``v_raw
    [B, capacity, H, D]``: the slots and clamped positions of
    :func:`nsa.ops.decode.cache_write.gather_cmp_blocks`, the tokens of
    :class:`nsa.modules.MLPCompression` (up to the products' order of summation).

    ``pdl``: whether each launch may start while the one before it runs (programmatic dependent
    launch; default: on a GPU that has it), loading its parameters meanwhile. It changes when
    the launches run, never what they compute."""
    B, capacity, H = k_raw.shape[:3]
    rows = B * count * H
    if rows == 0:
        return
    DK, DV = k_raw.shape[3], v_raw.shape[3]
    hid_k = _check_weights("weights[0]", weights[0], k_raw, config)
    hid_v = _check_weights("weights[1]", weights[1], v_raw, config)
    hid_max = max(hid_k, hid_v)
    on_gpu = k_raw.device.type == "cuda"
    min_dot = min_dot_side(k_raw.device)
    prec = dot_precision(k_raw.dtype, k_raw.device, max(DK, DV))
    exact = prec == "ieee" and k_raw.dtype == torch.float32  # exact float32 products hold tiles in registers
    BD = max(min_dot, next_power_of_2(max(DK, DV)))
    BM = row_tile(rows, BD, k_raw.dtype, k_raw.device)
    BJ = max(min_dot, min(32 if exact else 64, next_power_of_2(hid_max)))
    BH = max(min_dot, min(64, next_power_of_2(hid_max)))
    split_positions = math.gcd(config.cmp_block, SPLIT_POSITIONS)
    splits = config.cmp_block // split_positions
    partial = torch.empty(2, splits, rows, hid_max, dtype=torch.float32, device=k_raw.device)
    chunks, d_max = cdiv(hid_max, BH), max(DK, DV)
    share = torch.empty(2, chunks, rows, d_max, dtype=torch.float32, device=k_raw.device)
    geometry = dict(CMP_BLOCK=config.cmp_block, CMP_STRIDE=config.cmp_stride, DK=DK, DV=DV)
    # The second launch, every split at once: tiles of 16 rows, no pipelining; else split by
    # split, the first launch's row tiles. 8 warps either way (compiled for sm_90: 58 registers,
    # 18 KB of shared memory split by split; in 4 warps that program spilled 56 bytes)
    at_once = rows >= SUM_AT_ONCE_MIN_ROWS
    sum_rows, sum_stages = (min(BM, 16), dict(num_stages=1)) if at_once else (BM, {})
    if pdl is None:
        pdl = on_gpu and pdl_supported(k_raw.device)
    early = pdl_launch(pdl)
    (k_w, v_w) = weights
    mlp_hidden_kernel[(cdiv(hid_max, BJ), splits, cdiv(rows, BM) * 2)](
        last, last.stride(0), k_raw, v_raw, k_w.pos_emb, v_w.pos_emb, k_w.w1, v_w.w1, partial,
        rows, count, capacity, H, hid_k, hid_v, hid_max, BM=BM, BJ=BJ, BD=BD, SPLIT_POSITIONS=split_positions,
        PREC=prec, PDL=pdl, num_warps=4, **geometry, **early, **LAUNCH_OPTIONS,
    )  # fmt: skip
    mlp_share_kernel[(cdiv(rows, sum_rows), 2, chunks)](
        partial, k_w.b1, v_w.b1, k_w.w2, v_w.w2, share, rows, hid_k, hid_v, hid_max, splits, d_max, DK=DK, DV=DV,
        BM=sum_rows, BN=BD, BH=BH, BS=next_power_of_2(splits), AT_ONCE=at_once, PREC=prec, PDL=pdl, num_warps=8,
        **sum_stages, **early, **LAUNCH_OPTIONS,
    )  # fmt: skip
    mlp_store_kernel[(cdiv(rows, sum_rows), 2)](
        last, last.stride(0), share, k_w.b2, v_w.b2, k_cmp, v_cmp, rows, count, k_cmp.shape[1], H, d_max, chunks,
        BM=sum_rows, BN=BD, PDL=pdl, num_warps=4, **geometry, **early, **LAUNCH_OPTIONS,
    )  # fmt: skip
