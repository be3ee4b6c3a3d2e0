"""Selected-block attention in Triton: group-centric forward and deterministic backward.

This module launches the kernels (tiles, launch choices, the autograd function); the kernels are
in :mod:`.forward` and :mod:`.backward`, over the device helpers of :mod:`.tiles`.

Query ``i`` (position ``t = q_offset + i``) of KV group ``h`` attends to every
position ``s <= t`` of the blocks ``block_idx[b, i, h, :]`` (spec: "Selected
branch"); entries -1, blocks past ``t`` and repeats of an earlier entry are
skipped, so ``block_idx`` may come in any order.

Forward and ``dQ``: one program per (query position, KV head). The ``G`` query
heads of the group form the rows of one ``[GP, DK]`` tile (``GP`` = G padded to
at least 16 for the tensor cores), so every selected ``[BS, DK]`` key block is
fetched once for the whole group and met with one dot. A program may take ``BQ``
neighbouring positions instead (``NSA_SELECTED_TILE_QUERIES``): each block that any
of them holds is then fetched once, and a row counts it only if its query holds it,
which pays where neighbours choose the same blocks. Where tensor-descriptor copies run
(Hopper and later, and the interpreter), the forward fetches each block by one bulk copy.

``dK``/``dV`` invert the selection instead of scattering with atomics: the (query, block)
pairs are sorted by block on the device (no sync; :mod:`nsa.ops.selected.inversion`), and one program
per segment of at most ``QSEG`` queries of a (batch, KV head, block) walks those
queries, ``BQ`` at a time with all their heads as rows. A block chosen by more
than ``QSEG`` queries (the initial block is chosen by all of them) spreads over
several programs, whose float32 partials a second kernel sums in a fixed order.
Every output element thus has one writer: the result is deterministic.

Where the memory allows (:func:`ds_buffer`), the dK/dV kernel runs first and leaves each
(query, block) pair's ``dS`` in a buffer; the ``dQ`` kernel then reads ``K`` and ``dS``
(2 KiB a pair) instead of ``K`` and ``V`` and recomputing the softmax. Its loads, which bound
it, fall by almost half.

Every kernel holds a whole selection block a pipeline stage. A launch that the GPU's shared memory
cannot hold takes fewer stages, then reads each block in 2, 4 or 8 tiles of keys
(:func:`smaller_launch`; exact float32 with 128-key blocks and 192-wide heads needs 2).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from nsa import flags
from nsa.config import NSAConfig
from nsa.ops._dispatch import needs_grad
from nsa.ops._triton.attention import (
    EXACT_FLOAT32_TILES,
    LOG2E,
    attn_bwd_delta,
    check_gate,
    describable,
    descriptor_ready,
    dot_precision,
    dq_from_ds_budget,
    exact_float32,
    hopper_tiles_fit,
    last_dim_contiguous,
    next_pow2,
    pipeline_stages,
    token_tile_descriptor,
    wide_heads_on_small_gpu,
)
from nsa.ops._triton.device import bulk_copies_supported, sm_count
from nsa.ops._triton.launch import LAUNCH_OPTIONS, cdiv, fewer_stages, launch_within_shared_memory, next_power_of_2
from nsa.ops.selected import gluon_dkdv
from nsa.ops.selected.backward import (
    selected_bwd_dkdv_kernel,
    selected_bwd_dq_ds_kernel,
    selected_bwd_dq_kernel,
    selected_bwd_reduce_kernel,
    selected_forced_dq_kernel,
)
from nsa.ops.selected.forward import selected_forced_fwd_kernel, selected_fwd_kernel
from nsa.ops.selected.inversion import invert_selection


def _group_rows(G: int) -> int:
    """Rows of the per-position tile: G padded to a power of two, at least 16 (MMA tile)."""
    return next_pow2(G, 16)


#: Launch parameters (bf16, D = 128, G = 16: scripts/gpu_selected_window.py on an H200, then
#: scripts/gpu_prefill_probe.py on an H100). Forward and dQ: ``BQ`` query positions a program
#: (0: the ``NSA_SELECTED_TILE_QUERIES`` flag's, 1 by default; session 13, H100, forward / dQ
#: ms at 4 against 1: 8k 1.01 / 1.16 against 1.66 / 1.93 and 64k 8.75 / 9.92 against 15.7 /
#: 17.2 where every 4 neighbours hold the same blocks, 1.87 / 2.14 against 1.67 / 1.88 and 21.2 /
#: 24.6 against 15.9 / 17.5 with the random inputs' unrelated lists, about even where they share
#: half). dK/dV: ``BQ`` (queries per dK/dV step, 0: 64 rows' worth),
#: ``QSEG`` (queries per dK/dV program), ``num_warps`` (0: by head dim); ``FORCED_TILES`` serve
#: both forced-block kernels. ``KEY_TILES``: tiles every kernel reads a selection block in (1: whole;
#: see :func:`smaller_launch`). At head dims up to 128 the forward takes 1 warp (H100, 8k 1.70
#: against 1.77 ms for 2 warps, 64k 16.1 against 16.4) and the dQ 2 (8k 1.89 against 2.09 for 4,
#: 64k 17.4 against 18.2); wider heads keep 2 and 4, whose accumulators fit. The dK/dV kernel's
#: ``num_stages`` 0 means 3 for 16-bit heads up to 128 wide where shared memory is Hopper-sized
#: (H100, bitwise equal: 8k 1.90 against 2.08 ms for 2 stages, 64k 14.1 against 15.3), else 2;
#: its ``QSEG`` 0 means :func:`_dkdv_queries_per_program`.
#: ``KV_DESC`` (see :func:`_block_loads`): the forward fetches its blocks by bulk copies where
#: they run (H100, the whole ``nsa_attention`` forward: 8k 2.47 against 2.55-2.56 ms, 64k
#: 36.3-36.5 against 37.0-37.1; the forward alone, after the forced-block kernel, 1.64 against
#: 1.67 and 15.6 against 15.7). The dQ keeps plain loads: 1.92 against 1.87 and 17.4 against
#: 17.0 with copies (docs/perf/prefill.md, session 16). The dQ from ``dS`` takes copies (``KV_DESC``
#: None) only while K fits :data:`DQ_DS_COPIES_MAX_BYTES`.
FWD_TILES = dict(BQ=0, num_warps=0, num_stages=2, KV_DESC=None, KEY_TILES=1)
BWD_TILES = {"dq": dict(BQ=0, num_warps=0, num_stages=2, KV_DESC=False, KEY_TILES=1),
             "dq_ds": dict(num_warps=0, num_stages=2, KV_DESC=None, KEY_TILES=1),
             "dkdv": dict(BQ=0, QSEG=0, num_warps=0, num_stages=0, KEY_TILES=1)}
FORCED_TILES = dict(rows=64, num_warps=0, num_stages=2, KEY_TILES=1)
#: Where float32 is multiplied exactly (:func:`exact_float32`), every kernel takes
#: :data:`EXACT_FLOAT32_TILES`' warps to a query's rows (twice that for heads wider than 128):
#: the forward's 1 warp spilled 2.5 KB a thread, the dQ's 2 warps 2.2 KB. The forced-block and dK/dV
#: kernels take its rows, and the forward one stage: two ask 136 KiB with bulk copies (sm_90
#: compiles, head dim 128; docs/perf/float32.md).
EXACT_FLOAT32_FWD_STAGES = 1
#: Bytes of K up to which the dQ from ``dS`` fetches its blocks by bulk copies (``"dq_ds"``'s
#: ``KV_DESC`` None); plain loads beyond. Selected backward, loads against copies: 8k (K 8 MiB at
#: B = 1, 4 KV heads of 128) 3.346 against 3.292 ms on an H100, 3.173 against 3.074 on an H200;
#: 16k 6.711 against 6.748 and 32k 13.709 against 13.729 (H100), 64k 25.51 against 25.86 (H200).
DQ_DS_COPIES_MAX_BYTES = 8 << 20


#: Query positions a forward/dQ program may take: the ``NSA_SELECTED_TILE_QUERIES`` flag's choices.
TILE_QUERIES = tuple(int(c) for c in flags.FLAGS["NSA_SELECTED_TILE_QUERIES"].choices)


def _default_warps(dims: dict, narrow: int) -> int:
    """Warps by head width: ``narrow`` up to 128, twice that beyond."""
    return 2 * narrow if max(dims["BK"], dims["BV"]) > 128 else narrow


def _warps(cfg: dict, dims: dict, narrow: int) -> dict:
    """``cfg`` with ``num_warps`` 0 resolved by :func:`_default_warps`."""
    return dict(cfg, num_warps=cfg["num_warps"] or _default_warps(dims, narrow))


def _tile_launch(cfg: dict, dims: dict, narrow: int) -> dict:
    """Launch options of the forward or the dQ kernel: ``BQ`` query positions a program, one of
    :data:`TILE_QUERIES` (0: the ``NSA_SELECTED_TILE_QUERIES`` flag's), and ``num_warps`` 0
    resolved as ``narrow`` warps a query (:func:`_default_warps`), at most 8."""
    bq = cfg["BQ"] or flags.get("NSA_SELECTED_TILE_QUERIES")  # the flag's values are checked where it is read
    if bq not in TILE_QUERIES:
        raise ValueError(f"BQ (query positions per program) must be one of {', '.join(map(str, TILE_QUERIES))}, "
                         f"got {bq}")
    return dict(cfg, BQ=bq, num_warps=cfg["num_warps"] or min(8, _default_warps(dims, narrow) * bq))


def _block_loads(k: torch.Tensor, v: Optional[torch.Tensor], dims: dict, cfg: dict,
                 max_bytes: Optional[int] = None) -> Tuple[dict, dict]:
    """``(cfg, extra)``: the launch options without ``KV_DESC``, and the forward's or dQ's kernel
    arguments for it. ``KV_DESC`` True loads each selection block through tensor descriptors
    (``d_k``/``d_v``, :func:`~nsa.ops.selected.tiles.block_rows`; ``k``/``v`` copied first if a
    descriptor cannot describe them), None does where bulk copies run, the block fits a copy (at
    most 256 rows and columns), ``k``/``v`` need no copy and, given ``max_bytes``, take at most
    that many bytes; False uses plain loads. ``v`` None: a kernel that reads K alone."""
    cfg = dict(cfg)
    desc = cfg.pop("KV_DESC", False)
    tensors = {"k": (k, dims["BK"])} if v is None else {"k": (k, dims["BK"]), "v": (v, dims["BV"])}
    if cfg.get("KEY_TILES", 1) > 1:
        desc = False  # a bulk copy fetches a whole block
    elif desc is None:
        desc = (bulk_copies_supported(k.device) and max(dims["BSP"], *(w for _, w in tensors.values())) <= 256
                and all(describable(t) for t, _ in tensors.values())
                and (max_bytes is None or sum(t.numel() * t.element_size() for t, _ in tensors.values()) <= max_bytes))
    if not desc:
        return cfg, {}
    return cfg, dict(KV_DESC=True, **{f"d_{name}": token_tile_descriptor(descriptor_ready(t), dims["BSP"], width)
                                      for name, (t, width) in tensors.items()})


def smaller_launch(options: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The next smaller launch of a selected kernel than ``options`` (``smaller`` of
    :func:`~nsa.ops._triton.launch.launch_within_shared_memory`): one pipeline stage fewer, then, at
    one stage, each block read in twice the key tiles (``KEY_TILES``, down to 16 keys: ``tl.dot``'s
    least), by plain loads. Exact float32 with blocks of 128 keys and heads wider than 128 asked
    272-296 KiB of an H100's or H200's 227 even in one stage (session 79's sm_90 compiles)."""
    fewer = fewer_stages(options)
    if fewer is not None:
        return fewer
    tiles = 2 * options.get("KEY_TILES", 1)
    if options["BSP"] // tiles < 16:
        return None
    return dict({name: value for name, value in options.items() if name not in ("d_k", "d_v")}, KEY_TILES=tiles,
                **({"KV_DESC": False} if "KV_DESC" in options else {}))


def _dkdv_queries_per_program(selection: Tuple[int, int, int, int], num_blocks: int, sms: int) -> int:
    """Queries per dK/dV program: 1024, or 512 while 1024 would launch fewer than about nine
    programs per SM. The launch count is only known on the device after the inversion; from
    shapes it is about 1.5x ``max(owners, entries / 1024)`` (owners' counts spread around the
    mean and each rounds up). H100, selected dK/dV with 3 stages, 512 against 1024 queries: 8k
    (5.8 programs per SM) 1.75 against 1.89 ms, 10k (7.2) 2.22 against 2.30, 12k (8.7) 2.63
    against 2.73, 14k (10.2) 3.10 against 3.06, 16k (11.7) 3.51 against 3.43, 64k 14.07 against
    13.55 (docs/perf/prefill.md, session 9). ``selection`` is ``block_idx``'s shape ``(B, T, H, n)``."""
    B, T, H, N = selection
    estimate = max(B * H * num_blocks, B * T * H * N // 1024)
    return 512 if 3 * estimate < 2 * 9 * sms else 1024


def _dims(q, k, v, block_idx, sel_block: int, forced: Tuple[int, int] = (0, 0)) -> dict:
    """Constexpr dims of the kernels; ``forced = (init_blocks, local_blocks)``."""
    G, N = q.shape[2] // k.shape[2], block_idx.shape[-1]
    DK, DV = q.shape[-1], v.shape[-1]
    return dict(
        H=k.shape[2], G=G, GP=_group_rows(G), N=N, NP=next_power_of_2(N), BS=sel_block,
        BSP=next_pow2(sel_block), INIT=forced[0], LOCAL=forced[1], DK=DK, DV=DV, BK=next_pow2(DK), BV=next_pow2(DV),
        PREC=dot_precision(q.dtype, q.device, max(DK, DV)),
    )


def _forced_launch(dims: dict, q: torch.Tensor, backward: bool) -> Tuple[dict, int]:
    """Constexprs and launch parameters of a forced-block kernel for queries ``q`` (the ``dQ``
    kernel's with ``backward``), and its ``BT``."""
    head_dim = max(dims["DK"], dims["DV"])
    stages = pipeline_stages(FORCED_TILES["num_stages"], q.dtype, q.device, head_dim, wide_heads_one_stage=backward)
    cfg = _warps(dict(FORCED_TILES, num_stages=stages), dims, 4)
    if exact_float32(q.dtype, q.device, head_dim):
        cfg["rows"] = EXACT_FLOAT32_TILES["rows"]
    elif backward and wide_heads_on_small_gpu(head_dim, q.device):
        cfg["rows"] = 32  # 64 rows ask 112 KiB even in one stage, 32 rows 88 (sm_89 compiles, RTX 4090: 99)
    GP = next_power_of_2(dims["G"])
    BT = max(1, cfg.pop("rows") // GP)
    return dict(dims, GP=GP, BT=BT, **cfg), BT


def selected_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_idx: torch.Tensor, sel_block: int,
    scale: float, q_offset: int, tiles: Optional[dict] = None, forced: Tuple[int, int] = (0, 0),
    start: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward: ``o [B, T, HQ, DV]`` in q's dtype and log2-domain ``lse [B, T, HQ]`` float32.

    ``block_idx`` must be contiguous ``[B, T, H, N]``; ``tiles`` overrides :data:`FWD_TILES`.
    ``forced = (init_blocks, local_blocks)``: those blocks, wherever a query's list
    holds them, go through the tile-shared forced-block kernel first ((0, 0): none).
    ``start = (o, lse)``: the result over the forced blocks, already computed (by
    :func:`nsa.ops.window.kernel.window_fwd_forced`); the forced-block kernel does not run,
    and the kernel finishes ``o``/``lse`` in place and returns them.
    """
    return _fwd_launch(q, k, v, block_idx, sel_block, scale, q_offset, tiles, forced, start, None, True)[:2]


def selected_fwd_summed(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_idx: torch.Tensor, sel_block: int,
    scale: float, q_offset: int, gates: torch.Tensor, o_cmp: torch.Tensor, o_win: torch.Tensor,
    forced: Tuple[int, int] = (0, 0), start: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    keep: bool = True, tiles: Optional[dict] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(o, o_slc, lse_slc)``: the gated sum of the three branches (bitwise
    :func:`nsa.ops.combine_branches`'s) and, with ``keep``, this branch's own output and lse as
    :func:`selected_fwd` returns them (else None), from one launch (``forced``/``start`` as there)."""
    o_slc, lse, o = _fwd_launch(q, k, v, block_idx, sel_block, scale, q_offset, tiles, forced, start,
                                (gates, o_cmp, o_win), keep)
    return (o, o_slc, lse) if keep else (o, None, None)


def _fwd_launch(q, k, v, block_idx, sel_block, scale, q_offset, tiles, forced, start, summed, keep):
    """``(o, lse, o_sum)`` of :func:`selected_fwd` / :func:`selected_fwd_summed`."""
    B, T, HQ, _ = q.shape
    H, DV = k.shape[2], v.shape[-1]
    dims = _dims(q, k, v, block_idx, sel_block, forced)
    if start is not None:
        if not sum(forced):
            raise ValueError("selected_fwd: a start state is the forced blocks' result; forced must name them")
        o, lse = start
    else:
        o = torch.empty(B, T, HQ, DV, device=q.device, dtype=q.dtype)
        lse = torch.empty(B, T, HQ, device=q.device, dtype=torch.float32)
    args = (q, k, v, block_idx, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], T, q_offset, scale * LOG2E)
    if sum(forced) and start is None:
        meta, BT = _forced_launch(dims, q, backward=False)
        launch_within_shared_memory(selected_forced_fwd_kernel, (cdiv(T, BT), B * H), "selected_attention's forced blocks",
                                    *args, **meta, smaller=smaller_launch, **LAUNCH_OPTIONS)
    o_sum = torch.empty_like(o) if summed is not None else None
    gates, o_cmp, o_win = (x.contiguous() for x in summed) if summed is not None else (o, o, o)
    exact = exact_float32(q.dtype, q.device, max(dims["DK"], dims["DV"]))
    cfg = dict(FWD_TILES, **(dict(num_stages=EXACT_FLOAT32_FWD_STAGES) if exact else {}))
    cfg.update(tiles or {})
    cfg, loads = _block_loads(k, v, dims, _tile_launch(cfg, dims, EXACT_FLOAT32_TILES["num_warps"] if exact else 1))
    launch_within_shared_memory(
        selected_fwd_kernel, (cdiv(T, cfg["BQ"]), B * H), "selected_attention's forward",
        *args, gates, o_cmp, o_win, o if o_sum is None else o_sum, **dims, **cfg, SUMMED=summed is not None,
        KEEP=keep, **loads, smaller=smaller_launch, **LAUNCH_OPTIONS)
    return o, lse, o_sum


def selected_bwd_dq(q, k, v, block_idx, do, lse, delta, sel_block: int, scale: float, q_offset: int, cfg: dict,
                    forced: Tuple[int, int] = (0, 0), dq: Optional[torch.Tensor] = None,
                    gate: Optional[torch.Tensor] = None, forced_done: bool = False,
                    ds: Optional[torch.Tensor] = None, ds_cfg: Optional[dict] = None):
    """Launch the ``dQ`` kernels (``delta = rowsum(o * do)`` float32 ``[B, T, HQ]``):
    the forced-block share first when ``forced`` is not ``(0, 0)``, then the rest. Given
    ``dq`` (contiguous, q's shape and dtype), they add to it instead of a new tensor;
    given ``gate``, the branch's gradient is ``gate[..., None] * do`` (see :func:`selected_bwd`).
    ``forced_done``: another kernel adds the forced-block share (the window's, see
    :func:`nsa.ops.window.kernel.window_bwd`); only the rest is added here, to ``dq``
    (and :func:`selected_bwd_dkdv` then leaves out the local blocks, ``skip_local``).
    ``ds``: the rest comes from the ``dS`` that :func:`selected_bwd_dkdv` left there
    (:func:`~nsa.ops.selected.backward.selected_bwd_dq_ds_kernel`, launch options ``ds_cfg``, by
    default :data:`BWD_TILES`'s ``"dq_ds"``), not from a softmax of its own."""
    if forced_done and (dq is None or not sum(forced)):
        raise ValueError("selected_bwd_dq: forced_done needs the forced blocks named and a dq to add to")
    B, T, HQ, DK = q.shape
    H = k.shape[2]
    acc = dq is not None
    dq = dq if acc else torch.empty(B, T, HQ, DK, device=q.device, dtype=q.dtype)
    dims = dict(_dims(q, k, v, block_idx, sel_block, forced), ACC=acc, GATED=check_gate(gate, (B, T, HQ)))
    args = (q, k, v, block_idx, do, do if gate is None else gate, lse, delta, dq,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *do.stride()[:3], T, q_offset, scale * LOG2E, scale)
    if sum(forced) and not forced_done:
        meta, BT = _forced_launch(dims, q, backward=True)
        launch_within_shared_memory(selected_forced_dq_kernel, (cdiv(T, BT), B * H), "selected_attention's forced dQ",
                                    *args, **meta, smaller=smaller_launch, **LAUNCH_OPTIONS)
    exact = exact_float32(q.dtype, q.device, max(DK, v.shape[-1]))
    if ds is not None:
        launch, loads = _block_loads(k, None, dims, _warps(ds_cfg or BWD_TILES["dq_ds"], dims,
                                                           EXACT_FLOAT32_TILES["num_warps"] if exact else 1),
                                     DQ_DS_COPIES_MAX_BYTES)
        keep = ("H", "G", "GP", "N", "NP", "BS", "BSP", "INIT", "LOCAL", "DK", "BK", "ACC", "PREC")
        launch_within_shared_memory(
            selected_bwd_dq_ds_kernel, (T, B * H), "selected_attention's dQ",
            k, block_idx, ds, dq, *k.stride()[:3], T, q_offset, scale,
            **{key: dims[key] for key in keep}, **launch, **loads, smaller=smaller_launch, **LAUNCH_OPTIONS)
        return dq
    cfg, loads = _block_loads(k, v, dims, _tile_launch(cfg, dims, EXACT_FLOAT32_TILES["num_warps"] if exact else 2))
    launch_within_shared_memory(selected_bwd_dq_kernel, (cdiv(T, cfg["BQ"]), B * H), "selected_attention's dQ",
                                *args, **dims, **cfg, **loads, smaller=smaller_launch, **LAUNCH_OPTIONS)
    return dq


def selected_bwd_dkdv(q, k, v, block_idx, do, lse, delta, sel_block: int, scale: float, q_offset: int, cfg: dict,
                      gate: Optional[torch.Tensor] = None, skip_local: int = 0, ds: Optional[torch.Tensor] = None):
    """Invert the selection, then launch the ``dK``/``dV`` kernel and the in-order reduction
    (``gate`` as in :func:`selected_bwd_dq`). ``skip_local``: leave out each query's that many
    local blocks, whose share the window's dK/dV kernel adds (``window_bwd(..., forced=)``).
    ``ds [B, T, H, n, G, sel_block]`` (see :func:`ds_buffer`): also leave each pair's ``dS`` there."""
    B, T, HQ, DK = q.shape
    TK, H, DV = k.shape[1], k.shape[2], v.shape[-1]
    dims = _dims(q, k, v, block_idx, sel_block)
    GP = next_power_of_2(dims["G"])  # rows pack BQ queries: no need to pad G to 16 here
    cfg = dict(cfg)
    # tl.dot needs K >= 16 on the GPU, and the dK/dV products contract over BQ * GP query rows.
    head_dim = max(dims["BK"], dims["BV"])
    # 64 rows ask 112 KiB for heads wider than 128 even in one stage, 32 rows 80 (sm_89 compiles, RTX 4090: 99)
    if exact_float32(q.dtype, q.device, head_dim):
        rows = EXACT_FLOAT32_TILES["rows"]
    else:
        rows = 32 if wide_heads_on_small_gpu(head_dim, q.device) else 64
    cfg["BQ"] = max(cfg["BQ"] or rows // GP, -(-16 // GP))
    # 4 warps measured fastest at D = 128 (despite a small spill); wider tiles need 8 to hold the accumulators
    cfg = _warps(cfg, dims, 4)
    if not cfg["num_stages"]:
        cfg["num_stages"] = pipeline_stages(3 if hopper_tiles_fit(q.dtype, head_dim, q.device) else 2, q.dtype, q.device,
                                            head_dim, wide_heads_one_stage=True)
    num_blocks = cdiv(TK, sel_block)
    cfg["QSEG"] = cfg["QSEG"] or _dkdv_queries_per_program(tuple(block_idx.shape), num_blocks, sm_count(q.device))
    inv = invert_selection(block_idx, sel_block, q_offset, num_blocks, cfg["QSEG"], skip_local, ds is not None)
    n_prog, n_owner = inv["seg_owner"].numel(), B * H * num_blocks
    dk = torch.empty(B, TK, H, DK, device=k.device, dtype=k.dtype)
    dv = torch.empty(B, TK, H, DV, device=v.device, dtype=v.dtype)
    dk_part = torch.empty(n_prog, dims["BSP"], dims["BK"], device=q.device, dtype=torch.float32)
    dv_part = torch.empty(n_prog, dims["BSP"], dims["BV"], device=q.device, dtype=torch.float32)
    keep = ("H", "G", "BS", "BSP", "DK", "DV", "BK", "BV")
    # with each query's own block left out, every listed block ends before its query: the
    # mask's per-element predicates took a third of the loop's instructions (H100, 8k step
    # 7.79 -> 7.67 ms; docs/perf/prefill.md, session 18)
    causal, gated = skip_local == 0, check_gate(gate, (B, T, HQ))
    if gluon_dkdv.fits(q, k, v, do, sel_block, cfg["BQ"], ds is not None, causal):
        gluon_dkdv.selected_bwd_dkdv_gluon(q, k, v, do, gate, lse, delta, dk, dv, dk_part, dv_part, ds, inv,
                                           cfg["QSEG"], scale * LOG2E, scale)
    else:
        launch_within_shared_memory(
            selected_bwd_dkdv_kernel, (n_prog,), "selected_attention's dK/dV",
            q, k, v, do, do if gate is None else gate, lse, delta, dk, dv, dk_part, dv_part,  #
            inv["t_sorted"], inv["starts"], inv["counts"], inv["seg_first"], inv["seg_count"], inv["seg_owner"],  #
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],  #
            T, TK, q_offset, num_blocks, n_owner, scale * LOG2E, scale,  #
            GP=GP, PREC=dims["PREC"], GATED=gated, **{key: dims[key] for key in keep}, **cfg,
            **(dict(n_sorted=inv["n_sorted"], ds=ds, N=dims["N"], DS_OUT=True) if ds is not None else {}),
            CAUSAL=causal, smaller=smaller_launch, **LAUNCH_OPTIONS,
        )
    selected_bwd_reduce_kernel[(n_owner,)](
        dk, dv, dk_part, dv_part, inv["seg_first"], inv["seg_count"], TK, num_blocks, scale,  #
        **{key: dims[key] for key in keep if key != "G"}, **LAUNCH_OPTIONS,
    )
    return dk, dv


def selected_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_idx: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, sel_block: int, scale: float, q_offset: int, tiles: Optional[dict] = None,
    forced: Tuple[int, int] = (0, 0), delta: Optional[torch.Tensor] = None, dq: Optional[torch.Tensor] = None,
    gate: Optional[torch.Tensor] = None, forced_done: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward: ``(dq, dk, dv)`` shaped like ``(q, k, v)``, deterministic
    (``forced`` as in :func:`selected_fwd`, ``forced_done`` as in :func:`selected_bwd_dq`: ``dq``
    then lacks the forced blocks' share and ``dk``/``dv`` the local blocks', which the window's
    backward adds).

    ``tiles`` overrides :data:`BWD_TILES` per kernel, e.g. ``{"dkdv": {"QSEG": 256}}``.
    ``delta``: ``rowsum(o * do)`` float32 ``[B, T, HQ]`` if already computed (``o`` then
    unread); ``dq``: a gradient to add this branch's to (see :func:`selected_bwd_dq`).
    ``gate [B, T, HQ]``: ``do`` is the gradient of the gated sum and this branch's is
    ``gate[..., None] * do``; the kernels scale the probabilities by the gate instead, and
    ``delta`` stays ``rowsum(o * do)`` of the ``do`` given.
    """
    do = last_dim_contiguous(do)
    if delta is None:
        delta = attn_bwd_delta(o, do)  # [B, T, HQ]: rowsum(o * do) of the softmax backward
    head_dim = max(q.shape[-1], v.shape[-1])
    cfg = {kind: {**default, "num_stages": pipeline_stages(default["num_stages"], q.dtype, q.device, head_dim,
                                                           wide_heads_one_stage=kind != "dq_ds"),
                  **(tiles or {}).get(kind, {})} for kind, default in BWD_TILES.items()}
    skip_local = forced[1] if forced_done else 0
    ds = ds_buffer(q, block_idx, sel_block, cfg["dq"])
    if ds is not None:  # dK/dV first: it leaves dS for the dQ
        dk, dv = selected_bwd_dkdv(q, k, v, block_idx, do, lse, delta, sel_block, scale, q_offset, cfg["dkdv"], gate,
                                   skip_local, ds)
    dq = selected_bwd_dq(q, k, v, block_idx, do, lse, delta, sel_block, scale, q_offset, cfg["dq"], forced, dq, gate,
                         forced_done, ds, cfg["dq_ds"])
    if ds is None:
        dk, dv = selected_bwd_dkdv(q, k, v, block_idx, do, lse, delta, sel_block, scale, q_offset, cfg["dkdv"], gate,
                                   skip_local)
    return dq, dk, dv


def ds_buffer(q: torch.Tensor, block_idx: torch.Tensor, sel_block: int, dq_cfg: dict) -> Optional[torch.Tensor]:
    """The buffer ``[B, T, H, n, G, sel_block]`` (q's dtype) in which the dK/dV kernel leaves each
    (query, block) pair's ``dS`` for the dQ kernel, or None where the dQ computes its own softmax:
    when the buffer would pass :func:`ds_budget`, or the dQ takes several query
    positions a program (``NSA_SELECTED_TILE_QUERIES``). Reading ``K`` and ``dS`` instead of
    ``K`` and ``V`` nearly halves the dQ's bytes, which bound it, and drops its softmax and
    ``dP`` product; the dK/dV kernel pays for the stores (H200, selected backward: 8k 3.42 ->
    3.15 ms, 64k 28.2 -> 25.5; docs/perf/prefill.md, session 17)."""
    B, T, H, N = block_idx.shape
    G = q.shape[2] // H
    size = B * T * H * N * G * sel_block * q.element_size()
    if size > ds_budget(q.device) or (dq_cfg["BQ"] or flags.get("NSA_SELECTED_TILE_QUERIES")) != 1:
        return None
    return torch.empty(B, T, H, N, G, sel_block, device=q.device, dtype=q.dtype)


def ds_budget(device: torch.device) -> int:
    """Bytes :func:`ds_buffer` may take: ``NSA_SELECTED_DQ_FROM_DS_MIB`` (:func:`dq_from_ds_budget`;
    by default an eighth of the GPU's memory, 10 GiB on an 80 GB H100: enough for B = 1 at 64k tokens)."""
    return dq_from_ds_budget("NSA_SELECTED_DQ_FROM_DS_MIB", device)


class SelectedAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: saves ``q, k, v, block_idx, o, lse`` for the kernels' backward."""

    @staticmethod
    def forward(ctx, q, k, v, block_idx, sel_block: int, scale: float, q_offset: int, forced: Tuple[int, int]):
        o, lse = selected_fwd(q, k, v, block_idx, sel_block, scale, q_offset, forced=forced)
        ctx.save_for_backward(q, k, v, block_idx, o, lse)
        ctx.sel_block, ctx.scale, ctx.q_offset, ctx.forced = sel_block, scale, q_offset, forced
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, block_idx, o, lse = ctx.saved_tensors
        dq, dk, dv = selected_bwd(q, k, v, block_idx, o, lse, do, ctx.sel_block, ctx.scale, ctx.q_offset, forced=ctx.forced)
        return dq, dk, dv, None, None, None, None, None


def selected_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_idx: torch.Tensor,
    config: NSAConfig,
    scale: float,
    q_offset: int,
) -> torch.Tensor:
    """``[B, Tq, HQ, Dv]``: attention over the selected positions ``s <= t`` (Triton).

    Same contract as :func:`nsa.ops.selected.reference.selected_attention`:
    ``block_idx`` int32/int64 ``[B, Tq, H, n]`` in any order, -1 and repeats ignored.
    Inputs are float16/bfloat16/float32 with stride 1 in the last dim (copied
    otherwise). Tensors are saved for backward only when a gradient is needed.
    """
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))
    block_idx = block_idx.contiguous()
    if q.shape[1] == 0:
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    # the config's forced blocks are shared by whole tiles of queries (any block_idx stays exact)
    forced = (config.init_blocks, config.local_blocks)
    if needs_grad(q, k, v):
        return SelectedAttentionFunction.apply(q, k, v, block_idx, config.sel_block, scale, q_offset, forced)
    return selected_fwd(q, k, v, block_idx, config.sel_block, scale, q_offset, forced=forced)[0]
