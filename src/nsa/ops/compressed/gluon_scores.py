"""The compressed forward's scoring pass on Hopper, warp-specialised and persistent (Gluon): the
block masses that ``compressed_fwd_kernel`` (:mod:`nsa.ops._triton.compressed_fwd`) writes in its
launches of pass 2 alone (``PASS2_APART``), from the log2-domain ``lse`` pass 1 left.

Why: at 64k tokens the Triton pass 2 takes 5.5 ms of the 31 ms forward on an H200. Its exponentials
alone need about 2.2 ms of the special-function units and its one product about as long on the tensor
cores, and the two can overlap. This kernel takes 4.84 ms there (1.14x), 1.26 against 1.39-1.45 at 32k
(session 67; ``docs/perf/prefill.md``).

One program an SM walks work items, each the Triton launch's 128 query rows (``128 // G`` positions of
one KV head's ``G`` heads), the longest walks first. One warp copies every key tile of ``TOKENS``
compressed tokens an item's queries score, item after item, into a ring of slots. Two warpgroups
compute, each over its half of every key tile (64 tokens), with the product transposed, ``S^T = K
Q^T`` (64 tokens by the 128 rows). Each warpgroup gathers an item's query rows (cp.async) into its own
slot in an order that puts most of a position's heads in one thread's registers (:func:`position_bit`),
so that the head sums need no shuffles and a block's tokens lie on lanes four apart (two lane bits);
it gathers the next item's rows and lse while it walks this one. It takes key tiles in pairs, each
product in registers of its own, and issues the next tile's product before it turns this one into
masses, which then overlap on the tensor cores and the special-function units.

Made after three forms measured on the H200 at 64k (``scripts/gpu_session67.sh``): a program a tile
with the rows in order (heads summed across lanes, 96 shuffles a tile) 7.16 ms; the rows gathered in
the order above 5.67; the pairs 5.47, where about 4 us a program went beside its walk (copying its
rows and lse, its first key tile, launching).

The masses are the Triton pass 2's (spec Eq. 9-10): ``p = exp2(s * scale - lse)``, a token's mass split
over the selection blocks its units overlap (plane ``s`` of a row holds, at each block, what the tokens
of the block ``s`` before it put there), summed over the group's heads; they differ from the Triton
kernel's by rounding (the sums run in another order). Tiles past the tokens an item's first query sees
are masked by each row's visible count (spec ``Nc(t)``).

Gluon has no CPU interpreter: the kernel runs on Hopper GPUs only, where the GPU tests compare it with
the Triton launch (``tests/ops/test_gluon_scores.py``); the CPU tests compile it for sm_90 with the
installed Triton (:func:`compile_for_hopper`). :func:`fits` says where it applies.
"""

from __future__ import annotations

import torch
from triton.runtime.jit import constexpr_function

from nsa import flags
from nsa.ops._gluon import PAIR_LAUNCH as LAUNCH_OPTIONS  # two computing warpgroups, a copy warp
from nsa.ops._gluon import (async_copy, compile_for_sm90, copies_fit, descriptor_signature, fence_async_shared,
                            gather_async, gl, gluon, head_items_grid, launch_descriptors, launch_failed, mbarrier,
                            on_hopper, thread_barrier, tma_load, visible_compressed, warpgroup_mma, warpgroup_mma_wait,
                            wgmma_layout)

#: Query rows a program (the Triton pass 2's 128), which both computing warpgroups share.
ROWS = 128
#: Compressed tokens a ring slot; each computing warpgroup takes half.
TOKENS = 128
#: Slots of the key ring (32 KiB each; the query rows take 128 KiB: two slots a warpgroup). Two
#: measured faster than four (5.20 against 5.47 ms at 64k, session 67, a program a tile).
STAGES = 2


def geometry_fits(tokens_per_block: int) -> bool:
    """Whether a selection block's ``R`` compressed tokens tile a warpgroup's 64: a power of two up to 64
    (the spec's defaults: 4)."""
    return 1 <= tokens_per_block <= 64 and tokens_per_block & (tokens_per_block - 1) == 0


def fits(q: torch.Tensor, k_cmp: torch.Tensor, tokens_per_block: int) -> bool:
    """Whether this kernel replaces the Triton pass 2: ``NSA_GLUON_COMPRESSED_SCORES`` on, a Hopper GPU
    with Gluon, and inputs and a geometry it takes (:func:`shapes_fit`, :func:`geometry_fits`)."""
    return (flags.get("NSA_GLUON_COMPRESSED_SCORES") and on_hopper(q) and shapes_fit(q, k_cmp)
            and geometry_fits(tokens_per_block))


def shapes_fit(q: torch.Tensor, k_cmp: torch.Tensor) -> bool:
    """Contiguous 16-bit inputs with 128-wide heads (the TMA copies take them as row matrices) and 8-64
    query heads a KV head (a program's 128 rows hold whole positions)."""
    return copies_fit(q, k_cmp) > 0


@constexpr_function
def position_bit(G: int, bit: int) -> bool:
    """Whether bit ``bit`` of a product column (of 128) is a position's: the ``log2(128 // G)`` position
    bits take the two a thread shares with three other lanes (bits 1 and 2) first, then the highest;
    the head bits are the rest, so that most of a position's heads lie in one thread's registers."""
    n_pos = (128 // G).bit_length() - 1
    return bit in (1, 2, 6, 5, 4, 3)[:n_pos]


@constexpr_function
def bit_rank(G: int, bit: int) -> int:
    """The place of column bit ``bit`` among the position bits (in the position's index) or among the
    head bits (in the head's), counted from the lowest."""
    return sum(1 for b in range(bit) if position_bit(G, b) == position_bit(G, bit))


@constexpr_function
def head_axis(G: int, i: int) -> int:
    """The axis of the ``i``-th lowest head bit in a column index split into its 7 bits (``[rows, bit
    6, ..., bit 0]``): summed lowest bit first, so that each sum leaves the next one's axis in place."""
    heads = [b for b in range(7) if not position_bit(G, b)]
    return 7 - heads[i]


if gluon is not None:

    @gluon.jit
    def _scored_tiles(i_t, T1, q_offset, BTP: gl.constexpr, SEL: gl.constexpr, R: gl.constexpr,
                      BN: gl.constexpr):
        """Key tiles an item (query tile ``i_t``) walks: those holding the tokens of every block up to its
        last query's own (the top-n kernel reads each query's blocks up to its own; masses of tokens not yet visible
        are 0)."""
        t_last = q_offset + gl.minimum(i_t * BTP + BTP, T1) - 1
        return gl.cdiv((t_last // SEL + 1) * R, BN)

    @gluon.jit
    def _column_owner(o_c, G: gl.constexpr):
        """The position (in an item's query tile) and head of each product column ``o_c``
        (:func:`position_bit`)."""
        pos = gl.zeros_like(o_c)
        head = gl.zeros_like(o_c)
        for bit in gl.static_range(7):
            b = (o_c >> bit) & 1
            if position_bit(G, bit):
                pos += b << bit_rank(G, bit)
            else:
                head += b << bit_rank(G, bit)
        return pos, head

    @gluon.jit
    def _item(item, n_qt, BH, T0, H: gl.constexpr, BTP: gl.constexpr):
        """``(i_t, i_b, i_h)`` of work item ``item``: the query tiles of ``[T0, T1)`` (``n_qt`` a head)
        last first, every (batch, KV head) of a tile in turn (``BH``), so that the longest walks go first
        and the programs running at a time read neighbouring key tiles of few heads."""
        bh = item % BH
        return T0 // BTP + n_qt - 1 - item // BH, bh // H, bh % H

    @gluon.jit
    def _copy_partition(k_desc, k_smem, k_ready, k_empty, NC, q_offset, T0, T1, BH, H: gl.constexpr,
                        G: gl.constexpr, SEL: gl.constexpr, R: gl.constexpr, STAGES: gl.constexpr):
        """One warp: the key tiles of the program's items, one after another through the ring (a slot
        once both warpgroups have released its previous tile; every slot starts released)."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DH: gl.constexpr = k_desc.block_type.shape[1]
        BTP: gl.constexpr = 128 // G
        n_qt = gl.cdiv(T1 - T0, BTP)
        c = 0
        for item in range(gl.program_id(0), n_qt * BH, gl.num_programs(0)):
            i_t, i_b, i_h = _item(item, n_qt, BH, T0, H, BTP)
            for j in range(_scored_tiles(i_t, T1, q_offset, BTP, SEL, R, BN)):
                slot = c % STAGES
                mbarrier.wait(k_empty.index(slot), (c // STAGES) & 1)
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                # tokens past the batch's last are masked: any rows do (past the tensor's, zeros)
                tma_load(k_desc, [i_b * NC + j * BN, i_h * DH], k_ready.index(slot), k_smem.index(slot))
                c += 1

    @gluon.jit
    def _prefetch(q, lse2, q_dst, lse_dst, item, n_qt, BH, TQ, T0, H: gl.constexpr, G: gl.constexpr):
        """Start copying work item ``item``'s query rows and their log2-domain lse into ``q_dst`` and
        ``lse_dst`` in the column order of :func:`_column_owner` (a gather: a TMA copy moves rows in
        order), as one group of asynchronous copies (cp.async)."""
        BTP: gl.constexpr = 128 // G
        DH: gl.constexpr = q_dst.shape[1]
        i_t, i_b, i_h = _item(item, n_qt, BH, T0, H, BTP)
        rows_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        pos, head = _column_owner(gl.arange(0, 128, layout=gl.SliceLayout(1, rows_layout)), G)
        t = gl.minimum(i_t * BTP + pos, TQ - 1)  # a position past the last: any real one
        o_row = ((i_b.to(gl.int64) * TQ + t) * H + i_h) * G + head
        o_d = gl.arange(0, DH, layout=gl.SliceLayout(0, rows_layout))
        gather_async(q_dst, q + gl.expand_dims(o_row * DH, 1) + gl.expand_dims(o_d, 0))
        pos, head = _column_owner(gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0])), G)
        t = gl.minimum(i_t * BTP + pos, TQ - 1)
        gather_async(lse_dst, lse2 + (i_b.to(gl.int64) * TQ + t) * (H * G) + i_h * G + head)

    @gluon.jit
    def _issue(k_smem, k_ready, j, queries_t, s_zero, WG: gl.constexpr, STAGES: gl.constexpr):
        """Warpgroup ``WG``'s product of tile ``j`` once its keys have landed: ``S^T`` of its 64 tokens
        against the program's 128 columns, asynchronous."""
        slot = j % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        return warpgroup_mma(k_smem.index(slot).slice(WG * 64, 64), queries_t, s_zero, use_acc=False, is_async=True)

    @gluon.jit
    def _tile_masses(s, tok0, lse, i_t, NC, q_offset, nv_first, scores, row0, m_store, NSEL, qk_scale,
                     G: gl.constexpr, L: gl.constexpr, S: gl.constexpr, R: gl.constexpr, KC: gl.constexpr,
                     NSPILL: gl.constexpr):
        """The block masses of a warpgroup's 64 tokens from ``tok0`` on, from their scores ``s`` ``[64
        tokens, 128 columns]`` (columns as :func:`_column_owner` places them), stored to each position's
        score row (``row0`` offsets ``[positions]``, ``m_store`` the positions a launch writes), plane
        after plane."""
        BTP: gl.constexpr = 128 // G
        o_tok = tok0 + gl.arange(0, 64, layout=gl.SliceLayout(1, s.type.layout))
        x = s * qk_scale - gl.expand_dims(lse, 0)
        if tok0 + 64 > nv_first:  # a column may not see every token: mask before the exponential
            pos, _ = _column_owner(gl.arange(0, 128, layout=gl.SliceLayout(0, s.type.layout)), G)
            nv = visible_compressed(q_offset + i_t * BTP + pos, NC, L, S)
            x = gl.where(gl.expand_dims(o_tok, 1) < gl.expand_dims(nv, 0), x, float("-inf"))
        # each token's probability summed over the heads of a position, in registers but for G = 64
        p_bits = gl.reshape(gl.exp2(x), [64, 2, 2, 2, 2, 2, 2, 2])
        for i in gl.static_range(7 - (BTP.bit_length() - 1)):
            p_bits = gl.sum(p_bits, axis=head_axis(G, i))
        p_pos = gl.reshape(p_bits, [64, BTP])
        # a tile past the last block stores nothing; the branch also keeps ptxas from hoisting the wait
        # for the next tile's product above these sums (it moves a wait up to the start of its block)
        if tok0 // R < NSEL:
            o_r = gl.arange(0, 64, layout=gl.SliceLayout(1, p_pos.type.layout)) % R  # place in its block
            for shift in gl.static_range(NSPILL):
                # units [r, r + KC) of a token against block `shift` further's [shift R, shift R + R)
                overlap = gl.minimum(o_r + KC, shift * R + R) - gl.maximum(o_r, shift * R)
                weight = gl.where(overlap > 0, overlap, 0).to(gl.float32) / KC
                mass = gl.sum(gl.reshape(p_pos * gl.expand_dims(weight, 1), [64 // R, R, BTP]), axis=1)
                # at the block the mass lands in: the top-n reads the planes aligned (``block_topn``)
                o_dst = tok0 // R + shift + gl.arange(0, 64 // R, layout=gl.SliceLayout(1, mass.type.layout))
                rows = gl.convert_layout(row0, gl.SliceLayout(0, mass.type.layout))
                m_pos = gl.convert_layout(m_store, gl.SliceLayout(0, mass.type.layout))
                gl.store(scores + gl.expand_dims(rows + shift * NSEL, 0) + gl.expand_dims(o_dst, 1), mass,
                         mask=gl.expand_dims(m_pos, 0) & gl.expand_dims(o_dst < NSEL, 1))

    @gluon.jit
    def _compute_partition(q, lse2, scores, q_smem, lse_smem, k_smem, k_ready, k_empty, TQ, NC, q_offset, qk_scale,
                           T0, T1, NSEL, BH, H: gl.constexpr, G: gl.constexpr, L: gl.constexpr, S: gl.constexpr,
                           SEL: gl.constexpr, R: gl.constexpr, KC: gl.constexpr, NSPILL: gl.constexpr,
                           WG: gl.constexpr, STAGES: gl.constexpr):
        """Warpgroup ``WG``'s half of every key tile of the program's items (the module's docstring gives
        a step's order). Its own two slots of query rows and lse take turns: while it walks an item, the
        next item's are copied into the other."""
        M: gl.constexpr = 128
        BN: gl.constexpr = k_smem.shape[1]
        BTP: gl.constexpr = M // G
        s_layout: gl.constexpr = wgmma_layout(M)
        s_zero = gl.zeros([64, M], gl.float32, layout=s_layout)
        n_qt = gl.cdiv(T1 - T0, BTP)
        n_items = n_qt * BH
        _prefetch(q, lse2, q_smem.index(2 * WG), lse_smem.index(2 * WG), gl.program_id(0), n_qt, BH, TQ, T0, H, G)
        async_copy.commit_group()
        c = 0  # the ring's tiles walked so far
        k = 0  # the program's items so far
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            buf = 2 * WG + k % 2
            nxt = item + gl.num_programs(0)
            if nxt < n_items:  # the other slots' item finished its products before this one began
                _prefetch(q, lse2, q_smem.index(4 * WG + 1 - buf), lse_smem.index(4 * WG + 1 - buf), nxt, n_qt, BH,
                          TQ, T0, H, G)
            async_copy.commit_group()  # (empty past the last item: one group an item either way)
            async_copy.wait_group(1)  # this item's copies
            fence_async_shared()
            thread_barrier()
            i_t, i_b, i_h = _item(item, n_qt, BH, T0, H, BTP)
            pos, _ = _column_owner(gl.arange(0, M, layout=gl.SliceLayout(0, s_layout)), G)
            lse = lse_smem.index(buf).load(gl.SliceLayout(0, s_layout))
            # a column that sees nothing (lse -inf) is masked everywhere: shift it by 0; a padding one by
            # +inf, so that its probabilities are 0 in unmasked tiles too
            lse = gl.where(i_t * BTP + pos < TQ, gl.where(lse == float("-inf"), 0.0, lse), float("inf"))
            nv_first = visible_compressed(q_offset + i_t * BTP, NC, L, S)  # every column sees the tokens before
            o_p = i_t * BTP + gl.arange(0, BTP, layout=gl.BlockedLayout([1], [32], [4], [0]))
            row0 = ((i_b.to(gl.int64) * (T1 - T0) + o_p - T0) * H + i_h) * (NSPILL * NSEL)
            m_store = o_p < T1
            n_tiles = _scored_tiles(i_t, T1, q_offset, BTP, SEL, R, BN)
            queries_t = q_smem.index(buf).permute((1, 0))
            # tiles in pairs, each of the two products in registers of its own: a product carried from
            # one loop turn to the next in the registers it was issued into needs no copy, which ptxas
            # would have to wait for (a single carried product: the masses waited for the next product)
            s_a = _issue(k_smem, k_ready, c, queries_t, s_zero, WG, STAGES)
            s_a = warpgroup_mma_wait(0, deps=(s_a,))
            for i in range((n_tiles - 1) // 2):  # pairs with a tile after them
                j = 2 * i
                mbarrier.arrive(k_empty.index((c + j) % STAGES))
                s_b = _issue(k_smem, k_ready, c + j + 1, queries_t, s_zero, WG, STAGES)
                _tile_masses(s_a, j * BN + WG * 64, lse, i_t, NC, q_offset, nv_first, scores, row0, m_store, NSEL,
                             qk_scale, G, L, S, R, KC, NSPILL)
                s_b = warpgroup_mma_wait(0, deps=(s_b,))
                mbarrier.arrive(k_empty.index((c + j + 1) % STAGES))
                s_a = _issue(k_smem, k_ready, c + j + 2, queries_t, s_zero, WG, STAGES)
                _tile_masses(s_b, (j + 1) * BN + WG * 64, lse, i_t, NC, q_offset, nv_first, scores, row0, m_store,
                             NSEL, qk_scale, G, L, S, R, KC, NSPILL)
                s_a = warpgroup_mma_wait(0, deps=(s_a,))
            j = (n_tiles - 1) // 2 * 2  # s_a's tile; one more after it, or none
            mbarrier.arrive(k_empty.index((c + j) % STAGES))
            if j + 1 < n_tiles:
                s_b = _issue(k_smem, k_ready, c + j + 1, queries_t, s_zero, WG, STAGES)
                _tile_masses(s_a, j * BN + WG * 64, lse, i_t, NC, q_offset, nv_first, scores, row0, m_store, NSEL,
                             qk_scale, G, L, S, R, KC, NSPILL)
                s_b = warpgroup_mma_wait(0, deps=(s_b,))
                mbarrier.arrive(k_empty.index((c + j + 1) % STAGES))
                _tile_masses(s_b, (j + 1) * BN + WG * 64, lse, i_t, NC, q_offset, nv_first, scores, row0, m_store,
                             NSEL, qk_scale, G, L, S, R, KC, NSPILL)
            else:
                _tile_masses(s_a, j * BN + WG * 64, lse, i_t, NC, q_offset, nv_first, scores, row0, m_store, NSEL,
                             qk_scale, G, L, S, R, KC, NSPILL)
            c += n_tiles
            k += 1
        async_copy.wait_group(0)

    @gluon.jit
    def compressed_scores_gluon_kernel(
        q,  # [B, TQ, HQ, D]
        k_desc,  # k [B*NC, H*D] (TOKENS a copy)
        lse2, scores, TQ, NC, q_offset, qk_scale, T0, T1, NSEL, BH,
        H: gl.constexpr, G: gl.constexpr, L: gl.constexpr, S: gl.constexpr, SEL: gl.constexpr, R: gl.constexpr,
        KC: gl.constexpr, NSPILL: gl.constexpr, STAGES: gl.constexpr,
    ):
        """Persistent: grid ``(programs,)``, at most one an SM, over the ``BH = B * H`` heads' query tiles
        of 128 rows in ``[T0, T1)``; ``num_warps=4`` (the default partition is warpgroup 0),
        ``maxnreg=168``: the computing warpgroups get 240 registers, the copy warp 24. ``scores`` ``[B,
        T1 - T0, H, NSPILL, NSEL]`` float32, ``lse2`` ``[B, TQ, HQ]`` (log2 domain)."""
        DH: gl.constexpr = k_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        # each warpgroup's two slots of query rows, [128, DH] as a key tile: the key tile's shared layout
        q_smem = gl.allocate_shared_memory(k_desc.dtype, [4, 128, DH], k_desc.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [4, 128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, DH], k_desc.layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
        fence_async_shared()
        for i in gl.static_range(STAGES):  # every slot starts released by both warpgroups
            mbarrier.arrive(k_empty.index(i), count=2)
        WG0: gl.constexpr = 0
        WG1: gl.constexpr = 1
        gl.warp_specialize([
            (_compute_partition, (q, lse2, scores, q_smem, lse_smem, k_smem, k_ready, k_empty, TQ, NC, q_offset,
                                  qk_scale, T0, T1, NSEL, BH, H, G, L, S, SEL, R, KC, NSPILL, WG0, STAGES)),
            (_compute_partition, (q, lse2, scores, q_smem, lse_smem, k_smem, k_ready, k_empty, TQ, NC, q_offset,
                                  qk_scale, T0, T1, NSEL, BH, H, G, L, S, SEL, R, KC, NSPILL, WG1, STAGES)),
            (_copy_partition, (k_desc, k_smem, k_ready, k_empty, NC, q_offset, T0, T1, BH, H, G, SEL, R, STAGES)),
        ], [4, 1], [240, 24])


def compressed_scores_gluon(q, k_cmp, lse2, scores, q_offset: int, qk_scale: float, t0: int, t1: int, nsel: int,
                            geometry: dict) -> None:
    """Launch the kernel for queries ``[t0, t1)`` (``t0`` a multiple of ``128 // G``): their block
    masses into ``scores`` ``[B, t1 - t0, H, planes, nsel]`` float32 from ``lse2`` ``[B, TQ, HQ]``
    (pass 1's, log2 domain). ``geometry``: ``L``, ``S`` (compression), ``SEL`` (selection block),
    ``R``, ``KC``, ``NSPILL`` (:func:`~nsa.ops._triton.compressed_fwd._score_geometry`). A Triton whose
    Gluon cannot build it raises naming the flag that turns it off."""
    B, TQ, HQ, _ = q.shape
    NC, H = k_cmp.shape[1], k_cmp.shape[2]
    G = HQ // H
    (k_desc,) = launch_descriptors((q,), (k_cmp,), TOKENS)[1:]
    _, grid = head_items_grid(B, H, -(-(t1 - t0) // (ROWS // G)), q.device)
    try:
        compressed_scores_gluon_kernel[grid](q, k_desc, lse2, scores, TQ, NC, q_offset, qk_scale, t0, t1, nsel, B * H,
                                             H=H, G=G, STAGES=STAGES, **geometry, **LAUNCH_OPTIONS)
    except Exception as exc:  # Gluon is experimental: its API moves between Triton releases
        raise launch_failed("the compressed forward's scoring pass", "NSA_GLUON_COMPRESSED_SCORES", exc) from exc


def compile_for_hopper(G: int = 16, dtype: torch.dtype = torch.bfloat16):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU: what
    :func:`compressed_scores_gluon` would launch for ``G`` query heads a KV head (head dim 128) and the
    paper's compression and selection geometry. Returns Triton's compiled kernel (``asm``, ``metadata``)."""
    D = 128
    values = dict(H=4, G=G, L=32, S=16, SEL=64, R=4, KC=2, NSPILL=2, STAGES=STAGES)
    signature = {"q": "*bf16" if dtype == torch.bfloat16 else "*fp16",
                 **descriptor_signature(dtype, G, TOKENS, (), ("k_desc",), D),
                 "lse2": "*fp32", "scores": "*fp32",
                 "TQ": "i32", "NC": "i32", "q_offset": "i32", "qk_scale": "fp32",
                 "T0": "i32", "T1": "i32", "NSEL": "i32", "BH": "i32",
                 **{name: "constexpr" for name in values}}
    return compile_for_sm90(compressed_scores_gluon_kernel, signature, values, LAUNCH_OPTIONS,
                            aligned=("q", "lse2", "scores"))
