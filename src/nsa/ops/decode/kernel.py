"""Triton decode: one (or a few) new tokens per sequence over a KV cache, four launches.

This module launches them (:func:`decode_fwd`: the launch policy and its measurements); each
launch's kernel is a module of its own (:mod:`.compressed_pass`, :mod:`.score`,
:mod:`.selected`, :mod:`.combine`), over device helpers shared between them (:mod:`.tiles`,
:mod:`.sink`, :mod:`.topn`).

Every program works on one query row (sequence ``b``, new token ``i``) and one KV
group, so each key/value tile it loads serves the group's ``G`` query heads in
one ``tl.dot``. Positions come from the device tensor ``seq_lens``; grids and
buffers depend only on shapes, so a captured CUDA graph replays at any length.

1. ``decode_cmp_win_fwd_kernel`` (:mod:`.compressed_pass`): grid ``(S_CMP + S_WIN, rows * H)``. Split-K
   over the visible compressed tokens (the split size follows the length at run
   time) and over the window; each split writes a partial ``(acc, max, sum)``,
   and the compressed splits also write their log2-scaled logits, or, once the batch
   fills the GPU, each tile's block masses (a quarter of the bytes). Once the batch
   fills the GPU, or while a row holds at most 128 selection blocks, the window's
   splits move to launch 3 and the grid is ``(S_CMP, rows * H)``.
2. ``decode_score_kernel`` (:mod:`.score`): grid ``(block tiles, rows * H)``. Merges the
   compressed splits into each head's log-sum-exp, turns the logits into
   probabilities, sums them over the group and maps them onto selection blocks
   with the mass-conserving overlap weights (spec Eqs. 8-10); from block masses it
   only rescales and sums them. Each program keeps
   its tile's scores in registers and writes only the tile's ``n`` best block
   keys (its candidates, found by one all-pairs rank in the tile, not ``n`` rounds); where
   launch 3 merges them, at their ranks: a sorted run, largest first in the first half of the
   tiles and last in the second (the halves that merge's first level pairs). On a GPU each
   head's log-sum-exp takes the special-function unit's log2.
   It compiles without FMA fusion (``UNFUSED_LAUNCH_OPTIONS``): the rank compares each key
   with its tile's keys as other lanes hold them, and fused sums across lanes could leave a
   key's copies a bit apart, so that it outranked itself.
3. ``decode_selected_fwd_kernel`` (:mod:`.selected`): grid ``(S_SLC, rows * H)``, or ``(S_SLC + S_WIN,
   rows * H)`` with the window's splits (which wait for nothing). Every selection program
   finds the n largest keys among the candidates (forced blocks first, ties to
   the lower index: spec Eq. 11), attends over its share of the selected blocks,
   and the first one writes ``block_idx``. Where the candidates fit one tile, one
   bitonic merge of the tiles' sorted runs finds them (:func:`~nsa.ops.decode.topn.top_of_sorted_runs`; 1720
   against 2272 SASS instructions a batch-1 program with ``tl.topk`` over the unsorted
   candidates); otherwise rounds find the n-th largest
   key (each round the largest keys below the last round's smallest). When one
   score tile holds a whole row, its candidates are the top-n and nothing is ranked.
   Once the batch fills the GPU a selection program attends over the forced blocks among its
   ranks (the init and local blocks, which need no score) before it waits for the scores.
   (Counting, for each candidate, the larger ones instead of rounds of maxima measured
   slower on an H200: 34 us against 29 us at batch 1, 64k; rounds of 4 maxima, the
   default until session 21, 25.6 us against 23.6-23.8 for the top-k on an H100.)
4. ``decode_combine_kernel`` (:mod:`.combine`): grid ``(rows * HQ,)``. Merges the partials of each
   branch, a chunk of splits at a time, and applies the gates (or computes them first from the
   hidden state, given a :class:`~nsa.ops.gates.projection.GateProjection`). Launch 1's partials
   are merged before the wait for launch 3 (see below), the rest after it.

On Hopper and later, launches 2-4 use programmatic dependent launch (PDL): each starts
while the one before it runs, does the work that needs nothing from it (positions, query,
gates), then waits for it with ``gdc_wait``; the window's programs of launch 3 need nothing
and do not wait. Every other program of every PDL launch waits, so a launch's end implies
the end of all launches before it. The selection programs let launch 4 start only once their
own wait is over: by then launch 1 has ended (every score program waited for it), so launch 4
merges launch 1's partials while launch 3 still runs. Once the batch fills the GPU, launches 1
and 3 read the compressed keys and values and the selected blocks through tensor descriptors:
bulk copies into shared memory that the compiler issues stages ahead (see :func:`decode_fwd`
for the timings). Logits and partials, written by one launch and read by the next, carry L2
eviction hints (stored evict-last, read once evict-first).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from nsa.config import NSAConfig
from nsa.ops._triton.attention import (
    LOG2E,
    descriptor_ready,
    dot_precision,
    exact_float32,
    last_dim_contiguous,
    next_pow2,
    pipeline_stages,
    token_tile_descriptor,
)
from nsa.ops._triton.device import (
    bulk_copies_supported,
    min_dot_side,
    pdl_supported,
    shared_memory_per_program,
    sm_count,
)
from nsa.ops._triton.launch import LAUNCH_OPTIONS, UNFUSED_LAUNCH_OPTIONS, cdiv, next_power_of_2, pdl_launch
from nsa.ops.decode.combine import decode_combine_kernel
from nsa.ops.decode.compressed_pass import decode_cmp_win_fwd_kernel
from nsa.ops.decode.score import decode_score_kernel, reserve_shared_asm
from nsa.ops.decode.selected import decode_selected_fwd_kernel
from nsa.ops.decode.topn import run_bit
from nsa.ops.gates.projection import GateProjection


# Once the batch fills the GPU the compressed launch is one wave: (programs per SM, pipeline
# stages of each), the deeper first wherever its wave holds a split of every row-group. Shared
# memory and registers bound the programs per SM: 3 in 3 stages (a quarter of the registers
# left for the programs that programmatic dependent launch starts early), or 4 in 2.
FILL_CMP_WAVES = ((3, 3), (4, 2))


def fill_cmp_wave(rows_groups: int, device: torch.device) -> Tuple[int, int]:
    """``(programs per SM, pipeline stages)`` of the compressed launch once the batch fills the
    GPU: 3 programs in 3 stages while one wave of them holds a split of every (row, KV group),
    else 4 in 2 stages (whose wave is a third larger). On an H200, PDL on, us (session 42;
    ``docs/perf/decode.md``): batch 32, (3, 2, 8) in 3 stages against (4, 2, 8) in 2, 56.7-56.9
    against 60.5-60.6 at 8k to 131.2-131.5 against 137.4-138.6 at 64k; batch 64, (1, 2, 8) against
    (2, 2, 8), 96.0 against 98.5-99.0 at 8k to 248.1-248.2 against 252.5-253.6 at 64k; batch 16,
    (6, 2, 8) against (8, 2, 8), 79.9-80.1 against 81.1-81.3 at 64k, 61.2-61.4 against 61.0-61.1
    at 32k, but 48.5-48.6 against 46.6-46.7 at 16k and 41.1-41.2 against 40.0-40.1 at 8k. Two waves
    lose far more: (2, 2, 8) in 3 stages at batch 64, 287.2-287.5 us at 64k."""
    sms = _sm_count(device)
    return next(((per_sm, stages) for per_sm, stages in FILL_CMP_WAVES if rows_groups <= per_sm * sms),
                FILL_CMP_WAVES[-1])


# Once the batch fills the GPU the selected launch holds at most this many programs an SM: each
# bf16 program of head dim 128 takes 70 KiB of shared memory (3 pipeline stages of a block).
FILL_SELECTED_PROGRAMS_PER_SM = 3


def fill_selected_split(rows_groups: int, config: NSAConfig, device: torch.device) -> Tuple[int, int]:
    """``(window splits, selected blocks per program)`` once the batch fills the GPU, by the waves
    of the selected launch (``FILL_SELECTED_PROGRAMS_PER_SM`` programs an SM, the window's splits
    among them): 4 blocks a program where that launch stays one wave, else 8; and one window split
    instead of 256-token ones where that saves the launch a wave. On 132 SMs (paper defaults,
    H = 4): (2, 4) at batch 16, (1, 8) at 32 and 64. On an H200, PDL on, us, twice each (session
    42, ``docs/perf/decode.md``): batch 16, (6, 2, 4) against (6, 2, 8), 39.3-39.6 against
    41.0-41.7 at 8k and 79.0-79.7 against 80.4-80.9 at 64k (8 blocks and one window split, 39.9-40.3
    and 80.3-81.2; (6, 1, 4), 39.6 and 80.6-80.7); batch 32, (3, 1, 8) against (3, 2, 8),
    56.8-57.1 against 56.5-56.9 at 8k and 129.7-130.0 against 131.5-132.2 at 64k ((3, 2, 4), a
    second wave, 61.9-62.0 and 134.6-134.9); batch 64, (1, 1, 8) against (1, 2, 8), 91.0 against
    95.2 at 8k and 244.0-244.3 against 246.8-247.1 at 64k."""
    slots = FILL_SELECTED_PROGRAMS_PER_SM * _sm_count(device)
    win = max(1, cdiv(config.window, 256))

    def waves(blocks: int, window_splits: int) -> int:
        return cdiv(rows_groups * (cdiv(config.sel_count, blocks) + window_splits), slots)

    blocks = 4 if waves(4, win) == 1 else 8
    return (1 if waves(blocks, 1) < waves(blocks, win) else win), blocks


def default_splits(rows_groups: int, nc_cap: int, config: NSAConfig, device: torch.device) -> Tuple[int, int, int]:
    """``(compressed splits, window splits, selected blocks per program)``.

    The compressed branch is the bulk of the bytes: split it into about four programs
    per SM whatever the batch, in splits of at least ~256 tokens (at batch 1, 64k, 16
    splits of 256 measured 3 us faster than 32 of 128: fewer partials to merge), but
    into 8 splits wherever that count allows, however short: at batch 1, 8k, 8 splits
    of 64 tokens measured 20.1 us against 22.1 for 2 of 256 (a few serial tiles each
    instead of 4 programs per group in all; H200). The window takes ~128-token splits
    and each selected program one block.

    Since session 47, at least 16 compressed splits past 512 compressed tokens, and window
    splits of 64 tokens where the compressed ones are that short. The combine launch merges the
    compressed partials before it waits for the selected launch (session 46), so more of them
    cost less than they did; at 16k the window's 128-token splits were then the longest
    programs of launch 1. On an H200 at batch 1, us, twice each: 32k, (16, 4, 1) 18.2-18.4 and
    (16, 8, 1) 18.0-18.3 against the former (8, 4, 1) 19.4-19.6; 16k, (16, 8, 1) 16.7-16.9
    against (8, 4, 1) 17.3, (16, 4, 1) 17.4-17.6 and (8, 8, 1) 17.2-17.3; 64k, (16, 8, 1)
    20.7-20.8 against (16, 4, 1) 20.6-20.7, 32 or 24 compressed splits 22.3-24.1; 8k unchanged
    ((16, 4, 1) 16.2-16.4 against 16.1-16.4, (16, 8, 1) 16.4-16.7).

    Once the batch alone fills the GPU, the window runs in the selected launch
    (``window_in_selected``) and the compressed launch is one wave: as many splits as
    :func:`fill_cmp_wave`'s programs per SM allow (3 in 3 pipeline stages, or 4 in 2), with
    window splits and selected blocks a program from :func:`fill_selected_split`. On 132 SMs at
    64k that is (6, 2, 4) at batch 16, (3, 1, 8) at 32 and (1, 1, 8) at 64. Before session 42 it
    was 4 programs in 2 stages, 256-token window splits and 8 blocks a program at every such
    batch: at batch 16, 64k on an H100, (8, 2, 8) took 106.0-106.4 us against 107.3-107.6 for
    (6, 2, 8) in 3 stages (PDL off at the time); that one took 106.6-107.2 us against
    113.8-114.5 for the earlier (9, 4, 4) with the window in the compressed launch; 7
    compressed splits of 3 stages (two waves) took 119.9 us, and (6, 4, 4), (6, 4, 8), (6, 1,
    8), (6, 2, 16) 108.7-112.1."""
    sms = _sm_count(device)
    if _batch_fills_gpu(rows_groups, config, device):
        per_sm, _ = fill_cmp_wave(rows_groups, device)
        return (max(1, per_sm * sms // rows_groups),) + fill_selected_split(rows_groups, config, device)
    # past 512 compressed tokens (from 16k at the defaults) at least 16 splits, whose partials
    # are merged beside the selection programs since session 46, and window splits no longer
    # than the compressed ones, down to 64 tokens (launch 1 waits for its longest program);
    # 8k measured no faster either way (see the docstring)
    long_cache = nc_cap > 512
    s_cmp = max(1, min(cdiv(4 * sms, rows_groups), max(cdiv(nc_cap, 256), 16 if long_cache else 8)))
    win_tokens = 64 if long_cache and cdiv(nc_cap, s_cmp) <= 64 else 128
    return s_cmp, max(1, cdiv(config.window, win_tokens)), 1


def default_score_warps(programs: int, device: torch.device) -> int:
    """Warps of a score program: 4, or 1 once the score launch has more than four programs
    per SM. Past that point its 4-warp programs (56 registers) no longer fit in one wave, and
    each program's cross-warp reductions (the group sum, the rank in its tile) wait at
    barriers; one warp needs none. Batch 16 on an H200 (132 SMs), graph replay: 64k (2048
    programs) 83.9-84.1 against 86.5-86.9 us (the score kernel 8.2 against 11.2 us), 32k
    (1024) 61.3-61.4 against 62.3-62.5; 16k (512) equal; 8k (256) 43.4 against 42.7, and at
    batch 1 (128 programs at 64k) 26.6 against 23.5. On an H100 at batch 16: 64k 98.5-98.6
    against 101.1-101.9, 32k 71.5-71.8 against 72.5-72.6, 8k equal."""
    return 1 if programs > 4 * _sm_count(device) else 4


#: Score programs an SM at most (:func:`default_score_cap`), where the score launch averages more
#: than :data:`SCORE_CAP_FROM` programs an SM and holds at least :data:`SCORE_CAP_TILES` tiles a row.
#: The score launch's one-warp programs are placed as the compressed pass frees SMs, up to 32 an SM
#: (the most Hopper places) on the SMs freed first, and every one waits for that pass's end: at batch
#: 16, 64k an H200's SMs that held 32 ended 2-4 us after those that held 4 (session 49's stamps), and
#: each selection program waits for the score launch's last. A static shared-memory array that
#: nothing reads (``CAP_ASM``, :func:`score_cap_asm`) caps them. H200, graph replay, us, two rounds
#: each in one call, capped at 20 against not (session 73, ``docs/perf/decode.md``): batch 16 at 64k
#: (2048 programs, 32 tiles a row) 71.5-71.7 against 72.9-73.1, and in another call 70.9-71.2
#: against 71.8-72.1 (12 an SM 72.6, 16 71.2-71.3, 24 71.2-71.3). Slower elsewhere, where the rule
#: does not apply: batch 16 at 32k (1024 programs) 53.3-53.4 against 52.8-52.9, at 8k 40.0-40.1
#: against 38.2-38.4, and batch 32 at 32k (2048 programs, 16 tiles a row) 83.4-83.5 against 82.1-82.5.
SCORE_PROGRAMS_PER_SM = 20
SCORE_CAP_FROM = 12
SCORE_CAP_TILES = 32


def default_score_cap(programs: int, row_tiles: int, device: torch.device) -> int:
    """Score programs an SM at most once the batch fills the GPU: :data:`SCORE_PROGRAMS_PER_SM`
    where the launch of ``programs`` averages more than :data:`SCORE_CAP_FROM` an SM, fits that cap
    in one wave and holds ``row_tiles`` >= :data:`SCORE_CAP_TILES` tiles a row (batch 16 at 64k on
    132 SMs), else 0 (no cap): the points measured faster and slower (above)."""
    sms = _sm_count(device)
    fits = SCORE_CAP_FROM * sms < programs <= SCORE_PROGRAMS_PER_SM * sms
    return SCORE_PROGRAMS_PER_SM if fits and row_tiles >= SCORE_CAP_TILES else 0


def score_cap_asm(programs: int, device: torch.device, cap: int) -> Optional[str]:
    """``CAP_ASM`` of a score launch of ``programs`` programs on ``device``: at most ``cap`` programs an
    SM. None (no cap) where ``cap`` is 0, would leave some of the programs no room in one wave, is
    not below the 32 that Hopper places at most, or on the CPU (the interpreter runs no PTX). The
    array stops at 46 KiB: a program's static and dynamic shared memory together may take 48 without
    the opt-in."""
    if device.type != "cuda" or not 0 < cap < 32 or programs > cap * _sm_count(device):
        return None
    # an SM's shared memory is a program's opt-in most plus the 1 KiB the driver keeps a program;
    # the program's own 256 B and a margin below each share
    per_program = (shared_memory_per_program(device) + 1024) // cap
    return reserve_shared_asm(min(per_program - 1024 - 512, 46 * 1024))


def _sm_count(device: torch.device) -> int:
    """SMs the launch heuristics plan for; the interpreter counts as two."""
    return sm_count(device, interpreter=2)


def _batch_fills_gpu(rows_groups: int, config: NSAConfig, device: torch.device) -> bool:
    """Whether one selected block per (row, group) program is more than four programs per
    SM: the batch alone then keeps the GPU busy, and the launch choices switch from hiding
    latency to moving bytes (batch 16 at the defaults is past it, batch 1 is not)."""
    return rows_groups * config.sel_count > 4 * _sm_count(device)


def decode_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: Union[torch.Tensor, GateProjection],
    seq_lens: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    config: NSAConfig,
    scale: float,
    *,
    splits: Optional[Tuple[int, int, int]] = None,
    block_tile: Optional[int] = None,
    token_tile: Optional[int] = None,
    num_warps: int = 4,
    cmp_warps: Optional[int] = None,
    combine_chunk: int = 64,
    score_blocks: Optional[int] = None,
    pdl: Optional[Union[bool, Tuple[bool, bool, bool]]] = None,
    score_contig: bool = True,
    cmp_desc: Optional[bool] = None,
    win_desc: bool = False,
    cmp_tile: Optional[int] = None,
    cmp_stages: Optional[int] = None,
    sel_desc: Optional[bool] = None,
    topn_per_round: Optional[int] = None,
    combine_heads: Optional[int] = None,
    window_in_selected: Optional[bool] = None,
    win_tile: Optional[int] = None,
    l2_hints: Optional[bool] = None,
    score_mass: Optional[bool] = None,
    score_warps: Optional[int] = None,
    topn_bitonic: bool = True,
    combine_early: bool = True,
    forced_early: Optional[bool] = None,
    score_cap: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Launch the four decode kernels; returns ``(o, block_idx)``.

    Overrides of the automatic choices (for tests and tuning): ``splits = (compressed,
    window, selected blocks per program)``, ``block_tile`` (candidates scanned at once by
    top-n), ``token_tile`` (tokens per attention tile), ``num_warps`` of the attention
    kernels (``cmp_warps`` of the compressed/window one alone), ``combine_chunk`` (splits
    the combine reads at once), ``score_blocks`` (selection blocks per scoring program:
    32, which measured 2 us faster than 64 at batch 1, 64k, but 64 for a batch-1 cache of at
    most 128 blocks), ``pdl`` (programmatic dependent
    launch: for the score, selected and combine launches alike, or a tuple of three flags, one
    each, which launches start early; every kernel still waits where it reads the launch
    before, which costs nothing in a launch that starts in stream order; at batch 1 all three
    early measured fastest on an H100, 23.6 us at 64k against 24.5-28.1 for the seven others),
    ``score_contig`` (scoring reads each tile's tokens as one contiguous range
    where the geometry allows), ``cmp_desc`` (compressed keys/values through tensor
    descriptors; ``win_desc`` the window's), ``cmp_tile``/``cmp_stages`` (token tile, at
    least 16 on a GPU, and pipeline stages of the compressed/window kernel alone), ``sel_desc`` (selected blocks
    through tensor descriptors, where ``l'`` is a power of two, and at least 16 on a GPU), ``topn_per_round`` (keys
    each top-n round takes: 1, 2, 4 or 8; one that does not divide ``n`` becomes 1),
    ``combine_heads`` (heads per combine program on the GPU), ``window_in_selected`` (the window's
    splits as programs of the selected launch), ``win_tile`` (their token tile),
    ``l2_hints`` (logits and partials stored with the L2 policy evict-last and read back,
    once, with evict-first), ``score_mass`` (the compressed pass leaves each tile's block
    masses instead of its logits, where the geometry allows), ``score_warps`` (warps of a score
    program; :func:`default_score_warps`) and ``topn_bitonic`` (the selection programs rank the
    candidates by one bitonic merge of the score tiles' sorted runs where they fit one tile,
    instead of rounds) and ``combine_early`` (the selection programs let the combine launch start
    only once their wait is over, and the combine merges the compressed launch's partials before
    its own wait: on an H200, the two trees in turn three times, us, batch 16 at 64k 77.6-78.0
    against 78.7-79.2, at 8k 37.8-38.9 against 38.5-39.0, batch 32 at 64k 127.5-127.8 against
    128.0-128.6, batch 1 at 64k 21.2-21.4 against 21.3-21.6, at 8k within noise),
    ``forced_early`` (with ``sel_desc``, the selection programs attend over the forced blocks
    among their ranks before they wait for the score launch; on by default with ``sel_desc``),
    ``score_cap`` (once the batch fills the GPU, at most this many score programs an SM, through
    shared memory that they reserve and do not use: :func:`score_cap_asm`; None:
    :func:`default_score_cap`, 0: none).

    ``forced_early``: at batch 16, 64k on an H200 the selection programs ended 9-10 us after
    their top-n, bound by the selected blocks' bytes, and 3 of each row's 16 blocks need no
    score. The tree of session 48 and this one in turn, three times, us (session 49): batch 16
    at 64k 73.6-73.9 against 72.4-72.9, at 32k 52.6-52.9 against 52.0-52.2 (as a variant), at
    8k 37.4-37.5 against 37.6-38.9; batch 32 at 64k 123.3-123.9 against 122.9-125.0; batch 1
    (not changed) the same. Its blocks in a loop over the used slots alone: the same tree with
    every slot read and the unused ones masked took 75.2-75.3 at batch 16, 64k and 128.8-129.3
    at batch 32.
    The compressed programs letting the score launch start only as they end (so that its
    programs spread evenly over the SMs rather than pile up to 32 on those the compressed launch
    leaves first) measured slower at most points and was dropped (session 49,
    ``docs/perf/attempts/decode_score_late.patch``).

    Defaults from Hopper on, measured on an H200 at 64k (graph replay): while the batch
    does not fill the GPU (batch 1), PDL on (26.7 against 29.4 us) and plain loads for the
    compressed pass (descriptors: 26.1 us with contiguous scoring, against 25.4). Once it
    does (batch 16), compressed tiles of 32 tokens through descriptors (the kernel 49.0
    against 54.4 us; 101.1 against 105.2 us for the step, with PDL on). PDL stays on there
    too since session 42 (off from session 4, when it measured 118.5 against 108.2 us at
    batch 16, 64k: programs that started early held SM slots the running launch needed).
    With the one-wave compressed launch, one-warp score programs and the window's programs
    in the selected launch (which then start during the compressed pass), on an H200, us,
    on against off: batch 16 at 8k 40.1 against 42.8-43.0, 16k 46.5-46.8 against 49.1, 32k
    61.0 against 59.3-59.6 (the one loss), 64k 81.4-81.5 against 81.1-81.6; batch 32
    60.3 against 64.5 (8k) to 137.4-137.7 against 142.3 (64k); batch 64 98.1-98.4 against
    101.7-102.0 (8k) to 251.7-252.1 against 256.4-256.5 (64k). At 8k, batch 16, the gain
    needs the score and selected launches both early (40.4 us; either alone 42.6-43.4).
    Contiguous scoring always: 25.4 against 26.7 us at batch 1, 105.2 against 118.5 at
    batch 16. Top-n rounds of 4 keys: 23.7 against 25.5 us (rounds of 1)
    at batch 1, 64k; since session 21 one bitonic top-k instead (H100, graph replay: batch 1
    at 64k 23.6-23.8 against 25.6 us, the selected kernel 5.2-5.3 against 6.9-7.0 us eager; 8k
    16.6-17.4 against 17.5-18.2; batch 16 within 0.3 us either way); since session 44 a merge
    of the score tiles' sorted runs (with the score launch's fast log2, H200: batch 1 at 64k
    21.25-21.47 against 21.92-22.08 us, batch 16 78.94-79.04 against 79.30-79.87). Selected blocks through
    descriptors once the batch fills the GPU:
    97.6 against 100.1 us at batch 16, 64k (the selected kernel 17.8 against 20.6 us).
    ``combine_heads`` 4 once the batch fills the GPU: 93.2 against 98.1 us at batch 16,
    64k (50.1 against 54.7 at 8k). At batch 1 (H200): 4 at 8k, 18.7 against 19.6-19.8 us for 1,
    but 27.6 against 24.4 at 64k, whose 36 slots make the tile of 4 heads too large; 2 there,
    23.9 us. Hence as many heads (8, 4, 2 or 1; 8 since session 45, batch 16 at 8k 38.6-38.8
    against 39.0-39.1 us on an H200) as keep heads x slots (rounded up to a power of two)
    within 128. Since session 47 each branch has a tile of its own width, so that bound no longer
    sizes a tile; the rule stays as measured: at batch 1 on an H200, 1, 2 (the rule's) and 4 heads
    took the same time (32k 19.4-19.6 us, 64k 20.6-20.8).
    ``window_in_selected`` once the batch fills the GPU (see :func:`default_splits`), and at
    batch 1 for caches of at most 128 blocks (8k), whose compressed splits are a few tiles
    each: there the compressed launch shrinks (3.2 against 4.2 us) and the window's programs
    run beside the selection programs' top-n (H100, 8k: 17.6-18.1 against 18.7-18.9 us; 4k:
    17.9-18.1 against 18.7-18.9; H200, 8k: 17.4-17.6 against 18.3-18.5). At batch 1 and 16k
    no difference, at 32k +0.3 us, and at 64k 30.7-31.2 against 25.7 us (H100): there the
    window's programs ran beside the compressed splits for free, and in the selected launch
    they lengthen it.
    ``l2_hints`` on (H100, graph replay): batch 16 at 8k 50.5-50.6 against 51.7-52.1 us, 16k
    58.6-58.9 against 60.9-61.4, 64k 106.6-107.1 against 107.1-107.2; batch 1 within 0.4 us.
    The compressed launch once the batch fills the GPU takes 3 programs an SM in 3 stages, or 4
    in 2 where the first would need two waves (:func:`fill_cmp_wave`, session 42, H200, PDL on).
    With PDL off, in session 5, 4 programs in 2 stages measured 105.8-106.0 against 106.1-106.5
    us at batch 16, 64k, 50.3-50.7 against 50.8-51.0 at 8k (H100), and on the H200 the other
    way at 64k (88.0-88.1 against 86.8-87.3 us) and the same way at 8k (42.7-42.8 against
    43.1-43.3).
    """
    B, TQ, HQ, K = q.shape
    H, V = k.shape[2], v.shape[3]
    G, rows = HQ // H, B * TQ
    q = last_dim_contiguous(q).reshape(rows, HQ, K)
    gate_proj = isinstance(gates, GateProjection)
    if gate_proj:  # the combine launch computes them: x [rows, hidden], weight [3 * HQ, hidden], bias
        gate_x, gate_w, gate_b = gates.x.reshape(rows, -1), gates.weight, gates.bias
        hidden = gate_x.shape[1]
    else:
        gate_x, gate_w, gate_b, hidden = gates.reshape(rows, HQ, 3).contiguous(), None, None, 0
    k, v, k_cmp, v_cmp, k_win, v_win = (last_dim_contiguous(t) for t in (k, v, k_cmp, v_cmp, k_win, v_win))
    nc_cap, nblk_cap, n = max(k_cmp.shape[1], 1), config.num_sel_blocks(k.shape[1]), config.sel_count
    for name, tile in (("block_tile", block_tile), ("token_tile", token_tile), ("cmp_tile", cmp_tile),
                       ("win_tile", win_tile)):
        if tile is not None and (tile < 1 or tile & (tile - 1)):  # each is a tl.arange's length
            raise ValueError(f"{name} must be a power of two, got {tile}")
    s_cmp, s_win, sb = splits if splits is not None else default_splits(rows * H, nc_cap, config, q.device)
    s_slc = cdiv(n, sb)
    S = s_cmp + s_win + s_slc
    BG, BK, BV = next_pow2(G), next_pow2(K), next_pow2(V)
    BC = token_tile or (64 if max(BK, BV) <= 128 else 32)
    PREC = dot_precision(q.dtype, q.device, max(K, V))
    on_gpu = q.device.type == "cuda"
    fills = _batch_fills_gpu(rows * H, config, q.device)
    if pdl is None:
        pdl = on_gpu and pdl_supported(q.device)
    early = tuple(bool(e) for e in pdl) if isinstance(pdl, (tuple, list)) else (bool(pdl),) * 3
    if len(early) != 3:
        raise ValueError(f"pdl must be a bool or three flags (score, selected, combine launches), got {pdl!r}")
    pdl = any(early)
    if cmp_desc is None:
        cmp_desc = on_gpu and bulk_copies_supported(q.device) and fills
        cmp_tile = cmp_tile or (32 if cmp_desc else None)
    # a descriptor tile is the K of a whole tl.dot, which needs K >= 16 on a GPU (the
    # interpreter has no such limit, so CPU tests use smaller tiles)
    min_dot = min_dot_side(q.device)
    if cmp_tile is not None:
        cmp_tile = max(cmp_tile, min_dot)
    after_score, after_selected, after_combine = (pdl_launch(e) for e in early)
    f32 = dict(device=q.device, dtype=torch.float32)
    # what the compressed pass leaves for scoring: each tile's block masses where the
    # geometry allows (blocks of R = l'/d whole tokens, a power of two; a token reaching at
    # most one block further, l <= l' + d; tiles of whole blocks), else every logit
    tokens_per_block = config.sel_block // config.cmp_stride
    contig_ok = (config.sel_block % config.cmp_stride == 0 and config.cmp_block % config.cmp_stride == 0
                 and tokens_per_block == next_power_of_2(tokens_per_block))  # fmt: skip
    r_blk = tokens_per_block if contig_ok else 1
    cmp_bc = cmp_tile or BC  # the compressed pass's token tile
    if score_mass is None:
        # once the batch fills the GPU, where the compressed pass is bound by its writes:
        # 100.4-101.4 against 104.9-105.2 us at batch 16, 64k (the pass 51.3-51.6 against
        # 55.0-55.1); at batch 1 the extra register work costs more (64k: 26.2-26.4 against
        # 25.6-25.8; 8k: 19.0-19.2 against 18.5-18.7; H100)
        score_mass = fills
    score_mass = (score_mass and score_contig and contig_ok and config.cmp_block <= config.sel_block + config.cmp_stride
                  and cmp_bc % r_blk == 0)  # fmt: skip
    sink_stride = cdiv(nc_cap, cmp_bc) * (cmp_bc // r_blk + 2) if score_mass else nc_cap
    logits = torch.empty(rows * HQ, sink_stride, **f32)
    o_part, m_part, l_part = torch.empty(rows * HQ, S, V, **f32), torch.empty(rows * HQ, S, **f32), torch.empty(rows * HQ, S, **f32)
    block_idx = torch.empty(B, TQ, H, n, device=q.device, dtype=torch.int32)
    o = torch.empty(B, TQ, HQ, V, device=q.device, dtype=q.dtype)
    qk_scale = scale * LOG2E
    common = dict(TQ=TQ, H=H, G=G, BG=BG, PDL=pdl)
    attend = dict(K=K, V=V, BK=BK, BV=BV, BC=BC, PREC=PREC)
    cmp_attend = dict(attend, BC=cmp_bc)
    k_cmp_arg, v_cmp_arg, k_win_arg, v_win_arg = k_cmp, v_cmp, k_win, v_win
    if cmp_desc:
        k_cmp, v_cmp = descriptor_ready(k_cmp), descriptor_ready(v_cmp)
        k_cmp_arg, v_cmp_arg = token_tile_descriptor(k_cmp, cmp_attend["BC"], BK), token_tile_descriptor(v_cmp, cmp_attend["BC"], BV)
    if win_desc:
        k_win, v_win = descriptor_ready(k_win), descriptor_ready(v_win)
        k_win_arg, v_win_arg = token_tile_descriptor(k_win, cmp_attend["BC"], BK), token_tile_descriptor(v_win, cmp_attend["BC"], BV)
    if cmp_stages is None and fills:
        _, cmp_stages = fill_cmp_wave(rows * H, q.device)
    cmp_stages = pipeline_stages(cmp_stages, q.dtype, q.device, max(K, V))
    exact = exact_float32(q.dtype, q.device, max(K, V))
    if cmp_stages is None and exact:
        # exact float32 tiles of head dim 128 in Triton's default 3 stages ask 264 KiB, past an
        # H100's 227 (out of resources at the launch); one stage asks 72 KiB, two 136 with spills
        # (sm_90 and sm_80 compiles, docs/perf/other_gpus.md)
        cmp_stages = 1
    stages = dict(num_stages=cmp_stages) if cmp_stages else {}
    # the selected pass likewise: 140 KiB in 3 stages, past a consumer GPU's 99; 72 in one
    sel_stages = dict(num_stages=1) if exact else {}
    if window_in_selected is None:
        # at batch 1 only for short caches, whose compressed pass is a few tiles a split
        window_in_selected = fills or nblk_cap <= 128
    if l2_hints is None:
        l2_hints = on_gpu
    keep, drop = ("evict_last", "evict_first") if l2_hints else ("", "")
    decode_cmp_win_fwd_kernel[(s_cmp + (0 if window_in_selected else s_win), rows * H)](
        q, k_cmp_arg, v_cmp_arg, k_win_arg, v_win_arg, seq_lens, k_cmp, v_cmp, k_win, v_win,  #
        logits, o_part, m_part, l_part,  #
        q.stride(0), q.stride(1),  #
        k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2), v_cmp.stride(0), v_cmp.stride(1), v_cmp.stride(2),  #
        k_win.stride(0), k_win.stride(1), k_win.stride(2), v_win.stride(0), v_win.stride(1), v_win.stride(2),  #
        qk_scale, sink_stride, s_cmp, s_win, S,  #
        CMP_BLOCK=config.cmp_block, CMP_STRIDE=config.cmp_stride, WINDOW=config.window, CMP_DESC=cmp_desc, WIN_DESC=win_desc,
        KEEP=keep, MASS=score_mass, SEL_BLOCK=config.sel_block, R=r_blk,
        num_warps=cmp_warps or num_warps, **cmp_attend, **common, **stages, **LAUNCH_OPTIONS,
    )  # fmt: skip
    if score_blocks is None:
        # 64-block tiles where they halve a batch-1 row's candidates to 32 (at most 128
        # blocks, 8k at l' = 64: 20.2-20.4 against 21.2 us on an H100; the selected kernel's
        # top-n 5.0 against 6.2 us), or hold the whole row (4k: no top-n rounds at all,
        # 16.4-16.6 against 17.2-17.4 us, H200); at 16k and over, and at batch 16, no gain
        # or a loss; one tile of 128 (8k) measured 18.8 against 17.5 us
        score_blocks = 64 if not fills and nblk_cap <= 128 else 32
    BJ = next_pow2(score_blocks, 2)
    score_tiles = cdiv(nblk_cap, BJ)
    NP = next_pow2(n, 2)
    n_cand = score_tiles * NP  # NP candidate slots per score tile
    cand = torch.empty(rows * H, n_cand, device=q.device, dtype=torch.int64)
    tj = block_tile or min(1024, next_pow2(n_cand))
    one_tile, ranked = n_cand <= tj, score_tiles == 1
    # one bitonic merge of sorted runs needs every candidate in registers
    topn_bitonic = topn_bitonic and one_tile and not ranked
    score_programs = score_tiles * rows * H
    if score_cap is None:
        score_cap = default_score_cap(score_programs, score_tiles, q.device)
    decode_score_kernel[(score_tiles, rows * H)](
        seq_lens, logits, m_part, l_part, cand,  #
        sink_stride, n_cand, s_cmp, S,  #
        CMP_BLOCK=config.cmp_block, CMP_STRIDE=config.cmp_stride, SEL_BLOCK=config.sel_block,
        N=n, NP=NP, INIT=config.init_blocks, LOCAL=config.local_blocks,
        BSC=next_pow2(s_cmp, 2), BJ=BJ, NCOVER=(config.sel_block + config.cmp_block) // config.cmp_stride - 1,
        CONTIG=score_contig and contig_ok, R=r_blk, DROP=drop, MASS=score_mass, CMP_TILE=cmp_bc, SORTED=topn_bitonic,
        FAST_LOG2=on_gpu, RUN_BIT=run_bit(tj, NP),
        CAP_ASM=score_cap_asm(score_programs, q.device, score_cap) if fills else None,
        num_warps=score_warps or default_score_warps(score_programs, q.device), **common, **after_score,
        **UNFUSED_LAUNCH_OPTIONS,  # each key is ranked against the copies of its tile's keys in other lanes
    )  # fmt: skip
    # with combine_early the combine merges launch 1's branches (the compressed one, and the
    # window where launch 1 runs it) before its wait: the selection programs let it start only
    # once they have waited for the score launch, whose programs all waited for launch 1
    # (without PDL every launch starts after the one before it ends)
    sel_block = config.sel_block
    if sel_desc is None:
        sel_desc = on_gpu and bulk_copies_supported(q.device) and fills
    sel_desc = sel_desc and sel_block == next_power_of_2(sel_block) and sel_block >= min_dot
    per_round = topn_per_round or 4
    per_round = per_round if per_round in (1, 2, 4, 8) and n % per_round == 0 else 1
    d_k = d_v = k  # unused without SEL_DESC
    if sel_desc:
        k, v = descriptor_ready(k), descriptor_ready(v)
        d_k, d_v = token_tile_descriptor(k, sel_block, BK), token_tile_descriptor(v, sel_block, BV)
    decode_selected_fwd_kernel[(s_slc + (s_win if window_in_selected else 0), rows * H)](
        q, k, v, seq_lens, cand, block_idx, k_win, v_win,  #
        o_part, m_part, l_part,  #
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),  #
        k_win.stride(0), k_win.stride(1), k_win.stride(2), v_win.stride(0), v_win.stride(1), v_win.stride(2),  #
        qk_scale, n_cand, s_cmp + s_win, S, s_slc, s_win, s_cmp,  #
        SEL_BLOCK=sel_block, N=n, NP=NP, SB=sb, BJ=BJ, TJ=tj, ONE_TILE=one_tile,
        PER_ROUND=per_round, SEL_DESC=sel_desc, SMALL_TILE=min(16, BC), d_k=d_k, d_v=d_v,
        WIN=window_in_selected, WINDOW=config.window, WIN_TILE=max(win_tile or BC, min_dot), KEEP=keep,
        RANKED=ranked, BITONIC=topn_bitonic, LATE_TRIGGER=combine_early, INIT=config.init_blocks,
        LOCAL=config.local_blocks, FORCED_EARLY=sel_desc if forced_early is None else forced_early,
        num_warps=num_warps, **sel_stages, **attend, **common, **after_selected, **LAUNCH_OPTIONS,
    )  # fmt: skip
    if combine_heads is None:
        # up to 8 heads a program while heads x all slots stays within 128 (see above; measured
        # with one tile of all slots, and no worse since): batch 1 (36 slots, padded to 64) takes
        # 2, batch 16 (12 slots) 8
        combine_heads = next(hb for hb in (8, 4, 2, 1) if (HQ % hb == 0 and hb * next_pow2(S, 2) <= 128) or hb == 1)
    if HQ % combine_heads:
        raise ValueError(f"combine_heads={combine_heads} must divide the {HQ} query heads")
    # the interpreter prefers fewer, larger programs: the most heads of a group that a tile holds (a power
    # of two dividing G, so that a program's heads share a row)
    hb = combine_heads if on_gpu else G & -G
    # each branch in tiles of its own width (at batch 1, 64k: 16, 4 and 16 slots, where one tile
    # of all 36 slots takes 64)
    chunk = next_pow2(combine_chunk, 2)
    widths = {}
    for name, slots in (("C", s_cmp), ("W", s_win), ("S", S - s_cmp - s_win)):
        widths[f"BS{name}"] = next_pow2(max(slots, 1), 2)
        widths[f"BSX{name}"] = min(chunk, widths[f"BS{name}"])
    decode_combine_kernel[(rows * HQ // hb,)](
        o_part, m_part, l_part, gate_x, o, gate_w if gate_proj else gate_x, gate_b if gate_b is not None else gate_x,  #
        s_cmp, s_win, S, HQ, hidden, gate_x.stride(0),  #
        V=V, HB=hb, BV=next_pow2(V, 2), **widths, EARLY=combine_early, WIN_EARLY=not window_in_selected,
        PDL=pdl, DROP=drop,
        GATE_PROJ=gate_proj, BKG=min(512, next_power_of_2(max(hidden, 1))), HAS_BIAS=gate_b is not None,
        **after_combine, **LAUNCH_OPTIONS,
    )  # fmt: skip
    return o, block_idx


def nsa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: Union[torch.Tensor, GateProjection],
    seq_lens: torch.Tensor,
    k_cmp: torch.Tensor,
    v_cmp: torch.Tensor,
    k_win: torch.Tensor,
    v_win: torch.Tensor,
    config: NSAConfig,
    scale: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`nsa.ops.decode.reference.nsa_decode` (no backward)."""
    return decode_fwd(q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win, config, scale)
