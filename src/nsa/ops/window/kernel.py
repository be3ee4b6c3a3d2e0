"""Sliding-window attention in Triton: a banded flash attention, forward and backward.

This module launches the kernels (tiles, the autograd function, the forced blocks' routing); the
kernels are in :mod:`.forward` and :mod:`.backward`, over the device helpers of :mod:`.tiles`.

Query ``i`` sits at position ``t = q_offset + i`` and attends to keys ``s`` with
``t - W < s <= t`` (spec: "Sliding branch")::

    key s ->      0 1 2 3 4 5 6 7        (W = 3)
    query t = 0   x . . . . . . .
          t = 1   x x . . . . . .
          t = 2   x x x . . . . .
          t = 3   . x x x . . . .
          t = 4   . . x x x . . .

Tiles: a program owns ``BT`` consecutive positions times the ``G`` query heads of
one KV head (``GP`` >= G rows per position, padding masked), so each K/V tile is
loaded once for the whole group. Key tiles are walked in three ranges: the lower
band edge and the diagonal are masked, the tiles between run unmasked.

Backward: ``dQ`` walks the same band as the forward; ``dK``/``dV`` are computed by
one program per key tile walking the query tiles that see it, all heads of the
group included, so each output element has exactly one writer (deterministic,
no atomics). Neighbouring key tiles' bands overlap but for one run of ``BN``
positions: walked from their starts, tile ``n + 1`` reads a run of q and do a run
before tile ``n`` does, after every running program has moved on by that much (at
64k more than L2 holds). Phased (``PHASED``, the Hopper tiles' default), each band
starts at the run whose index is a multiple of the band's run count and wraps, so
the tiles that share a run read it together.

In the NSA prefill the forward and ``dQ`` kernels can also take the selected branch's
forced blocks (``FORCED``, :func:`forced_in_window`): its local blocks are the band's last
key tiles, so their scores serve both branches, and only the initial blocks cost extra
steps. That replaces the selected branch's forced-block kernels (H100, forward+backward:
8k 8.80-8.83 -> 8.32-8.36 ms, 64k 113.2-113.6 -> 110.1-110.3; docs/perf/prefill.md, session 15).
The ``dK``/``dV`` kernel takes the local blocks' share in the same way (the queries that hold
a key tile's blocks as local ones are the first of its band), which the selected branch's
inverted lists then leave out (H100: 8k 8.40-8.45 -> 8.36 ms, 64k 110.7-111.9 -> 110.7-110.8;
session 16).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from nsa import flags
from nsa.config import NSAConfig
from nsa.ops._dispatch import needs_grad
from nsa.ops._triton.attention import (
    LOG2E,
    attn_bwd_delta,
    check_gate,
    dot_precision,
    exact_float32_tiles,
    hopper_tiles_fit,
    last_dim_contiguous,
    next_pow2,
    pipeline_stages,
    wide_heads_on_small_gpu,
)
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, next_power_of_2
from nsa.ops.window import gluon_dkdv, gluon_dq, gluon_fwd
from nsa.ops.window.backward import window_bwd_dkdv_kernel, window_bwd_dq_kernel
from nsa.ops.window.forward import window_fwd_kernel


#: Launch parameters of the forward (H200, bf16, D = 128, G = 16: scripts/gpu_selected_window.py).
FWD_TILES = dict(rows=64, num_warps=4, num_stages=2)


def _tiles(G: int, DK: int, DV: int, rows: int) -> dict:
    """Tile sizes: ``BT`` positions of ``GP`` head rows make about ``rows`` rows."""
    GP = next_power_of_2(G)
    return dict(GP=GP, BK=next_pow2(DK), BV=next_pow2(DV), BT=max(1, rows // GP), BN=64)


def _fwd_launch(q, k, v, window, scale, q_offset, tiles, gated, keep, forced=None):
    """``(o, lse, o_win, o_frc, lse_frc)`` of the forward kernel; see :func:`window_fwd`,
    :func:`window_fwd_summed` and, for ``forced`` (the NSA config), :func:`window_fwd_forced`."""
    B, T, HQ, DK = q.shape
    H, DV = k.shape[2], v.shape[-1]
    G = HQ // H
    cfg = dict(FWD_TILES)
    exact = exact_float32_tiles(q.dtype, q.device, max(DK, DV))
    if exact:  # its rows and warps; the 64-key tiles then spill nothing
        cfg.update(rows=exact["rows"], num_warps=exact["num_warps"])
    cfg.update(tiles or {})
    cfg = dict(_tiles(G, DK, DV, cfg.pop("rows")), **cfg)
    if forced is not None:
        cfg = _forced_tiles(cfg, forced, q_offset)
    o = torch.empty(B, T, HQ, DV, device=q.device, dtype=q.dtype)
    o_win = torch.empty_like(o) if keep else None
    lse = torch.empty(B, T, HQ, device=q.device, dtype=torch.float32) if keep or not gated else None
    o_frc, lse_frc = (torch.empty_like(o), torch.empty_like(lse)) if forced is not None else (o, lse)
    if not gated and gluon_fwd.fits(q, k, v, q_offset, cfg["BN"] if forced is not None else 0):
        gluon_fwd.window_fwd_gluon(q, k, v, o, lse, o_frc, lse_frc, T, q_offset, window, scale * LOG2E,
                                   (forced is not None, forced.init_blocks if forced else 0,
                                    forced.local_blocks if forced else 0))
    else:
        gates, o_cmp, o_slc = (x.contiguous() for x in gated) if gated else (o, o, o)
        window_fwd_kernel[(cdiv(T, cfg["BT"]), B * H)](
            q, k, v, o, o if lse is None else lse, gates, o_cmp, o_slc, o if o_win is None else o_win,  #
            o_frc, o if lse_frc is None else lse_frc,  #
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],  #
            T, q_offset, window, scale * LOG2E,  #
            H=H, G=G, DK=DK, DV=DV, PREC=dot_precision(q.dtype, q.device, max(DK, DV)), GATED=gated is not None,
            KEEP=keep, FORCED=forced is not None, INIT=forced.init_blocks if forced else 0,
            LOCAL=forced.local_blocks if forced else 0, **cfg, **LAUNCH_OPTIONS,
        )
    if forced is None:
        o_frc = lse_frc = None
    return o, lse, o_win, o_frc, lse_frc


def forced_in_window(config: NSAConfig, group: int, q_offset: int) -> bool:
    """Whether :func:`window_fwd_forced` applies to ``config`` with ``group`` query heads a KV
    head: the ``NSA_FORCED_IN_WINDOW`` flag is on, ``local_blocks >= 1``, ``sel_block`` is a
    power of two from 16 to 64 (the window's key tile then), the local blocks lie inside the
    window (``window >= local_blocks * sel_block``) and ``q_offset`` is a multiple of the
    tile's positions. The caller must also know that the window and the selected branch read
    the same keys and values, and that the block lists come from the NSA selection (which
    always holds the forced blocks)."""
    bs = config.sel_block
    if not flags.get("NSA_FORCED_IN_WINDOW") or config.local_blocks < 1 or bs not in (16, 32, 64):
        return False
    # the forward's and the dQ's tiles (powers of two: the wider one's multiple suits both)
    positions = max(min(_tiles(group, 16, 16, rows)["BT"], bs)
                    for rows in (FWD_TILES["rows"], BWD_TILES["dq"]["rows"]))
    return config.window >= config.local_blocks * bs and q_offset % positions == 0


def window_fwd_forced(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: NSAConfig, scale: float, q_offset: int,
    tiles: Optional[dict] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(o, lse, o_frc, lse_frc)``: the window's output and log2-domain lse as
    :func:`window_fwd` returns them, and, from the same launch, the selected branch's
    attention over its forced blocks (``o_frc`` in q's dtype, ``lse_frc`` log2-domain
    float32), the state that :func:`nsa.ops.selected.kernel.selected_fwd` starts from
    (``start``). Only where :func:`forced_in_window` holds, with ``(k, v)`` the selected
    branch's keys and values and block lists from the NSA selection."""
    o, lse, _, o_frc, lse_frc = _fwd_launch(q, k, v, config.window, scale, q_offset, tiles, None, False, config)
    return o, lse, o_frc, lse_frc


def window_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float, q_offset: int,
    tiles: Optional[dict] = None, gated: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Launch the forward: ``o [B, T, HQ, DV]`` in q's dtype and log2-domain ``lse [B, T, HQ]`` float32.

    ``tiles`` overrides :data:`FWD_TILES` (``rows``, ``BN``, ``num_warps``, ``num_stages``).
    ``gated = (gates, o_cmp, o_slc)``: ``o`` is the gated sum of the three branches
    (:func:`nsa.ops.combine_branches`'s result, bitwise) and ``lse`` is ``None``.
    """
    return _fwd_launch(q, k, v, window, scale, q_offset, tiles, gated, False)[:2]


def window_fwd_summed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float, q_offset: int,
    gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, tiles: Optional[dict] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(o, o_win, lse)``: the gated sum of the three branches (bitwise
    :func:`nsa.ops.combine_branches`'s), and the window's own output and lse as
    :func:`window_fwd` returns them, from one launch. Training needs both; the sum then
    costs no separate pass over the three outputs."""
    o, lse, o_win = _fwd_launch(q, k, v, window, scale, q_offset, tiles, (gates, o_cmp, o_slc), True)[:3]
    return o, o_win, lse


#: Launch parameters of the backward kernels (bf16, D = 128, G = 16: dQ measured on an H200 with
#: scripts/gpu_selected_window.py). dK/dV takes 128-key tiles: each key tile re-reads q and do
#: over its whole band (W + BN positions), and at 64k those re-reads miss L2 and bound the kernel
#: by DRAM (74 %), so wider tiles read less. H100: 6.25-6.46 against 7.85-7.88 ms at 64k and 0.76
#: against 0.98 ms at 8k for 64-key tiles of 4 warps in 2 stages; 4 stages 6.6-6.7, 256-key tiles
#: 16.5, 128-key tiles with 4 warps 20.4 ms.
#: Session 54 (H200): the dK/dV walks each band phased (``PHASED``, see the module's docstring: the
#: key tiles that share a run of positions read its q and do at the same time, not a run apart). In
#: place (torch profiler, 5 steps a list) 8.99-9.03 ms at 64k against 9.66-10.05; the whole
#: forward+backward, rounds ABBA on two machines, 98.33-98.69 and 99.76-100.14 against 99.21-99.71
#: and 100.76-101.50 ms (8k 7.11-7.20 and 7.16-7.33 against 7.20-7.28 and 7.31-7.49). 32-row query
#: tiles, which compile without the 64-row ones' spills (255 registers and 328 bytes a thread on
#: sm_90), were faster alone with L2 flushed but slower in place: 8.46-8.53 against 7.52-7.57 ms at
#: 64k on another machine (docs/perf/prefill.md).
BWD_TILES = {"dq": dict(rows=64, num_warps=4, num_stages=2),
             "dkdv": dict(rows=64, BN=128, num_warps=8, num_stages=3, PHASED=True)}
#: dK/dV tiles where :data:`BWD_TILES`' do not fit (:func:`hopper_tiles_fit`): heads wider than
#: 128, whose 128-key accumulators would not fit; float32 inputs, whose 128-key tiles in 3 stages
#: take 289 KiB of shared memory (the H100 has 227: out of resources at the launch, session 25);
#: and GPUs with less shared memory than Hopper.
SMALL_DKDV_TILES = dict(rows=64, BN=64, num_warps=4, num_stages=2)
#: dK/dV tiles for heads wider than 128 on a GPU with less than 128 KiB of shared memory a program
#: (:func:`wide_heads_on_small_gpu`): 64-key tiles ask 104 KiB even in one stage, 32-key ones
#: 76.5 KiB in two (sm_89 compiles, RTX 4090: 99).
WIDE_ON_SMALL_GPU_DKDV_TILES = dict(rows=64, BN=32, num_warps=4, num_stages=2)


def _bwd_cfg(kind: str, G: int, DK: int, DV: int, tiles: Optional[dict], dtype: torch.dtype,
             device: torch.device) -> dict:
    """Launch options of the ``kind`` (``"dq"``, ``"dkdv"``) kernel for inputs of ``dtype`` on
    ``device``, the caller's ``tiles[kind]`` over the defaults."""
    small = kind == "dkdv" and not hopper_tiles_fit(dtype, max(next_pow2(DK), next_pow2(DV)), device)
    exact = exact_float32_tiles(dtype, device, max(DK, DV))
    if exact:
        cfg = exact
    elif small and wide_heads_on_small_gpu(max(DK, DV), device):
        cfg = dict(WIDE_ON_SMALL_GPU_DKDV_TILES)
    else:
        cfg = dict(SMALL_DKDV_TILES if small else BWD_TILES[kind])
    cfg["num_stages"] = pipeline_stages(cfg["num_stages"], dtype, device, max(DK, DV), wide_heads_one_stage=kind == "dq")
    cfg.update((tiles or {}).get(kind, {}))
    return dict(_tiles(G, DK, DV, cfg.pop("rows")), **cfg)


def _forced_args(forced: Optional[dict], gate: Optional[torch.Tensor], lse: torch.Tensor, kernel: str):
    """``(gate_frc, lse_frc, delta_frc)`` kernel arguments of the selected branch's forced share
    (placeholders without ``forced``), checking that its gate comes with the window's."""
    if forced is None:
        return lse, lse, lse
    frc_gate = forced.get("gate")
    if (frc_gate is None) != (gate is None):
        raise ValueError(f"{kernel}: the selected branch's gate comes with the window's, or neither")
    return lse if frc_gate is None else frc_gate, forced["lse"], forced["delta"]


def window_bwd_dq(q, k, v, do, lse, delta, window: int, scale: float, q_offset: int, cfg: dict,
                  dq: Optional[torch.Tensor] = None, gate: Optional[torch.Tensor] = None,
                  forced: Optional[dict] = None) -> torch.Tensor:
    """Launch the ``dQ`` kernel (``delta = rowsum(o * do)`` float32 ``[B, T, HQ]``); given
    ``dq`` (contiguous, q's shape and dtype), it adds to it instead of a new tensor;
    ``gate`` and ``forced`` as in :func:`window_bwd`."""
    B, T, HQ, DK = q.shape
    H = k.shape[2]
    acc = dq is not None
    dq = dq if acc else torch.empty(B, T, HQ, DK, device=q.device, dtype=q.dtype)
    frc = dict(FORCED=False)
    if forced is not None:
        config = forced["config"]
        cfg = _forced_tiles(cfg, config, q_offset)
        frc = dict(FORCED=True, INIT=config.init_blocks, LOCAL=config.local_blocks)
    gated = check_gate(gate, (B, T, HQ))
    frc_args = _forced_args(forced, gate, lse, "window_bwd_dq")
    if gluon_dq.fits(q, k, v, do, q_offset, cfg["BN"] if frc["FORCED"] else 0):
        gluon_dq.window_bwd_dq_gluon(q, k, v, do, gate, lse, delta, dq, frc_args, T, q_offset, window, scale * LOG2E,
                                     scale, (frc["FORCED"], frc.get("INIT", 0), frc.get("LOCAL", 0)), acc)
        return dq
    window_bwd_dq_kernel[(cdiv(T, cfg["BT"]), B * H)](
        q, k, v, do, do if gate is None else gate, lse, delta, dq, *frc_args,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],  #
        T, q_offset, window, scale * LOG2E, scale,  #
        H=H, G=HQ // H, DK=DK, DV=v.shape[-1], ACC=acc, GATED=gated,
        PREC=dot_precision(q.dtype, q.device, max(DK, v.shape[-1])), **frc, **cfg, **LAUNCH_OPTIONS,
    )
    return dq


def _forced_tiles(cfg: dict, config: NSAConfig, q_offset: int) -> dict:
    """``cfg`` with the key tiles made selection blocks and a tile's positions held in one (the
    forced blocks' condition, :func:`forced_in_window`)."""
    cfg = dict(cfg, BN=config.sel_block, BT=min(cfg["BT"], config.sel_block))
    if q_offset % cfg["BT"]:
        raise ValueError(f"forced blocks in the window kernel: q_offset={q_offset} must be a multiple of the tile's "
                         f"{cfg['BT']} positions (see forced_in_window)")
    return cfg


def window_bwd_dkdv(q, k, v, do, lse, delta, window: int, scale: float, q_offset: int, cfg: dict,
                    gate: Optional[torch.Tensor] = None, forced: Optional[dict] = None,
                    dkv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """Launch the ``dK``/``dV`` kernel: one writer per key tile, no atomics (``gate``,
    ``forced`` and ``dkv`` as in :func:`window_bwd`)."""
    B, T, HQ, DK = q.shape
    TK, H, DV = k.shape[1], k.shape[2], v.shape[-1]
    if dkv is None:
        dk = torch.empty(B, TK, H, DK, device=k.device, dtype=k.dtype)
        dv = torch.empty(B, TK, H, DV, device=v.device, dtype=v.dtype)
    else:
        dk, dv = dkv
        if dk.shape != k.shape or dv.shape != v.shape or not (dk.is_contiguous() and dv.is_contiguous()):
            raise ValueError(f"window_bwd_dkdv: dkv must be contiguous tensors shaped like k {list(k.shape)} and v "
                             f"{list(v.shape)}, got {list(dk.shape)} and {list(dv.shape)}")
    frc = dict(FORCED=False)
    if forced is not None:
        frc = dict(FORCED=True, BS=forced["config"].sel_block, LOCAL=forced["config"].local_blocks)
    gated = check_gate(gate, (B, T, HQ))
    if gluon_dkdv.fits(q, k, v, do, cfg):
        gluon_dkdv.window_bwd_dkdv_gluon(
            q, k, v, do, gate, lse, delta, dk, dv, _forced_args(forced, gate, lse, "window_bwd_dkdv"), T, q_offset,
            window, scale * LOG2E, scale, (frc["FORCED"], frc.get("BS", 1), frc.get("LOCAL", 0)),
            cfg.get("PHASED", False), dkv is not None)
        return dk, dv
    window_bwd_dkdv_kernel[(cdiv(TK, cfg["BN"]), B * H)](
        q, k, v, do, do if gate is None else gate, lse, delta, dk, dv,
        *_forced_args(forced, gate, lse, "window_bwd_dkdv"),  #
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],  #
        T, TK, q_offset, window, scale * LOG2E, scale,  #
        H=H, G=HQ // H, DK=DK, DV=DV, ACC=dkv is not None, GATED=gated,
        PREC=dot_precision(q.dtype, q.device, max(DK, DV)), **frc, **cfg, **LAUNCH_OPTIONS,
    )
    return dk, dv


def window_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    window: int, scale: float, q_offset: int, tiles: Optional[dict] = None,
    delta: Optional[torch.Tensor] = None, dq: Optional[torch.Tensor] = None, gate: Optional[torch.Tensor] = None,
    forced: Optional[dict] = None, dkv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward: ``(dq, dk, dv)`` shaped like ``(q, k, v)``, deterministic.

    ``tiles`` overrides :data:`BWD_TILES` per kernel, e.g. ``{"dq": {"num_warps": 8}}``.
    ``delta``: ``rowsum(o * do)`` float32 ``[B, T, HQ]`` if already computed (``o`` then
    unread); ``dq``: a gradient to add this branch's to (see :func:`window_bwd_dq`), and
    ``dkv = (dk, dv)`` likewise for the keys' and values' (contiguous, shaped like ``k``/``v``).
    ``gate [B, T, HQ]``: ``do`` is the gradient of the gated sum and this branch's is
    ``gate[..., None] * do``; the kernels scale the probabilities by the gate instead, and
    ``delta`` stays ``rowsum(o * do)`` of the ``do`` given.
    ``forced = dict(config=, lse=, delta=, gate=)``: the gradients also get the selected branch's
    share over its forced blocks (its log2-domain lse, delta and gate, the gate given with the
    window's), where :func:`window_fwd_forced` computed their forward: ``dq`` over all of them,
    ``dk``/``dv`` over the local ones. The selected branch's backward then leaves those out
    (``selected_bwd(..., forced_done=True)``).
    """
    G, DK, DV = q.shape[2] // k.shape[2], q.shape[-1], v.shape[-1]
    do = last_dim_contiguous(do)
    if delta is None:
        delta = attn_bwd_delta(o, do)  # [B, T, HQ]: rowsum(o * do) of the softmax backward
    dq = window_bwd_dq(q, k, v, do, lse, delta, window, scale, q_offset,
                       _bwd_cfg("dq", G, DK, DV, tiles, q.dtype, q.device), dq, gate, forced)
    dk, dv = window_bwd_dkdv(q, k, v, do, lse, delta, window, scale, q_offset,
                             _bwd_cfg("dkdv", G, DK, DV, tiles, q.dtype, q.device), gate, forced, dkv)
    return dq, dk, dv


class WindowAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves ``q, k, v, o, lse`` for the kernels' backward."""

    @staticmethod
    def forward(ctx, q, k, v, window: int, scale: float, q_offset: int):
        o, lse = window_fwd(q, k, v, window, scale, q_offset)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.window, ctx.scale, ctx.q_offset = window, scale, q_offset
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = window_bwd(q, k, v, o, lse, do, ctx.window, ctx.scale, ctx.q_offset)
        return dq, dk, dv, None, None, None


def window_gated_sum(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor,
    config: NSAConfig, scale: float, q_offset: int,
) -> torch.Tensor:
    """``g_cmp * o_cmp + g_slc * o_slc + g_win * o_win`` with the window branch's ``o_win``
    computed and summed in one launch: ``o_win`` never reaches memory. No backward (for
    inference: training needs ``o_win`` for the gates' gradient). Bitwise the result of
    :func:`sliding_window_attention` followed by :func:`nsa.ops.combine_branches`."""
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    if q.shape[1] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    return window_fwd(q, k, v, config.window, scale, q_offset, gated=(gates, o_cmp, o_slc))[0]


def sliding_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: NSAConfig, scale: float, q_offset: int
) -> torch.Tensor:
    """``[B, Tq, HQ, Dv]``: query ``t`` attends to positions ``t - w < s <= t`` (Triton).

    Same contract as :func:`nsa.ops.window.reference.sliding_window_attention`;
    inputs are float16/bfloat16/float32 with stride 1 in the last dim (copied otherwise).
    Tensors are saved for backward only when a gradient is needed.
    """
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    if q.shape[1] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    if needs_grad(q, k, v):
        return WindowAttentionFunction.apply(q, k, v, config.window, scale, q_offset)
    return window_fwd(q, k, v, config.window, scale, q_offset)[0]
