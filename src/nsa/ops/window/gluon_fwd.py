"""The window branch's forward on Hopper, warp-specialised (Gluon): ``window_fwd_kernel``
(:mod:`nsa.ops.window.forward`) without the gated sum, in the form of the window's Gluon dQ
(:mod:`nsa.ops.window.gluon_dq`).

Why: at 64k the Triton kernel takes 4.4-4.9 ms of the forward's 31.6 and of the forward+backward's 87
(H200, session 64), well below the window dK/dV's rate in Gluon: a query tile's band is 9 key tiles,
and each program's loads and start weigh on it. This kernel takes 4.52-4.56 ms against the Triton
kernel's 4.81-4.84 on one machine (session 65), 4.16-4.17 against 4.47-4.51 on another (session 66).

A work item is two of the Triton kernel's query tiles (``2 BT`` positions of one KV head's ``G`` heads,
128 rows), one a computing warpgroup; the kernel is persistent, as the Gluon dQ: one program an SM walks
the items ``program_id, program_id + programs, ...``. One warp copies: an item's ``q`` rows (one copy a
position) once both warpgroups have issued the previous item's last ``S = Q K^T``, then each 64-key tile
of ``k`` and ``v`` into a ring of slots that both warpgroups read and that runs on across items. A
warpgroup's step issues the next tile's ``S = Q K^T``, runs the softmax of this tile's scores while that
runs, rescales ``acc``, issues ``acc += P V`` and waits for both products. (Issuing this tile's ``P V``
before the softmax of the next ``S``, as FlashAttention-3 does, was 1.2x slower here: the forced blocks'
two states then spill registers.) With ``FORCED`` (the NSA prefill's selected branch reads the same
keys) the steps are the Triton kernel's: the local blocks first (the band's last tiles), whose state is
both branches'; that state is kept aside while the initial blocks left of them extend the selected
branch's alone, which is then stored (``o_frc``, ``lse_frc``: the selected kernel's starting state);
then the window's other tiles extend the kept state. Rows past the last query copy the last one's rows
and are not stored.

An item's steps run in phases, a loop each: the local blocks (masked by the band), the initial blocks
(before every row: no mask), the window's tiles that reach below the last query's band (masked) and the
rest (inside every row's band: no mask); the states switch between the loops. As one loop over generic
steps, ptxas selected the kept state into place at every step and every tile was masked: about 100 of
a step's 536 instructions. In phases the results are the same bit for bit, and the kernel takes 4.28-4.30
ms at 64k against 4.63-4.68 (session 68); the last step keeps the generic mask.

Gluon has no CPU interpreter: the kernel runs on Hopper GPUs only, where the GPU tests compare it with
the Triton kernel (``tests/ops/test_gluon_window_fwd.py``); the CPU tests compile it for sm_90 with the
installed Triton (:func:`compile_for_hopper`). :func:`fits` says where it applies.
"""

from __future__ import annotations

import torch

from nsa import flags
from nsa.ops._gluon import PAIR_LAUNCH as LAUNCH_OPTIONS  # two computing warpgroups, a copy warp
from nsa.ops._gluon import (a_operand_layout, compile_for_sm90, descriptor_signature, fill_key_slot, gl, gluon,
                            head_item, head_items_grid, launch_descriptors, launch_failed, mbarrier, on_hopper,
                            released_barrier, ring_barriers, tma_load, warpgroup_mma, warpgroup_mma_wait, wgmma_layout)

#: Query rows a computing warpgroup owns ((position, head) pairs of one KV group; two a program).
ROWS = 64
#: Keys a step (a slot of the ring), the selection block of the NSA prefill's forced share.
KEYS = 64
#: Slots of the key/value ring.
STAGES = 4


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int, forced_block: int = 0) -> bool:
    """Whether this kernel replaces the Triton forward (without the gated sum): ``NSA_GLUON_WINDOW_FWD``
    on, a Hopper GPU with Gluon, and inputs it takes (:func:`shapes_fit`)."""
    return flags.get("NSA_GLUON_WINDOW_FWD") and on_hopper(q) and shapes_fit(q, k, v, q_offset, forced_block)


def shapes_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offset: int, forced_block: int = 0) -> bool:
    """Contiguous 16-bit inputs with 128-wide heads and 8-64 heads a KV head; with the selected branch's
    forced blocks (``forced_block``, their size; 0 without), blocks of 64 keys, each holding whole
    programs (``q_offset`` a multiple of a program's ``2 BT`` positions). As the Gluon dQ's
    (:func:`nsa.ops.window.gluon_dq.shapes_fit`), whose tiles these are."""
    from nsa.ops.window import gluon_dq

    return gluon_dq.shapes_fit(q, k, v, q, q_offset, forced_block)


if gluon is not None:

    @gluon.jit
    def _steps(pair, T, q_offset, W, BT: gl.constexpr, BN: gl.constexpr, INIT: gl.constexpr, LOCAL: gl.constexpr,
               FORCED: gl.constexpr):
        """``(n_loc, n_init, steps, first, s_local, n_edge)`` of query tiles ``2 pair`` and the next: with
        ``FORCED`` the local blocks' tiles from ``s_local`` (``n_loc``), then the initial blocks left of
        them (``n_init``); then the window's tiles from ``first`` up to ``s_local`` (without ``FORCED``, to
        the last query), the first ``n_edge`` of them reaching below the last query's band: the Triton
        kernel's arithmetic (``key_band``) over the item's ``2 BT`` positions."""
        t_lo = q_offset + pair * 2 * BT
        t_hi = gl.minimum(t_lo + 2 * BT, q_offset + T) - 1
        first = gl.maximum(t_lo - W + 1, 0) // BN * BN
        n_loc = 0
        n_init = 0
        s_local = t_hi + 1
        if FORCED:
            s_local = gl.maximum(t_lo // BN - LOCAL + 1, 0) * BN
            n_loc = (t_hi - s_local) // BN + 1
            n_init = gl.cdiv(gl.minimum(INIT * BN, s_local), BN)
        n_win = gl.cdiv(s_local - first, BN)
        # the window's tiles that start below the last query's band (the rest lie inside every row's)
        n_edge = gl.minimum(gl.maximum(gl.cdiv(t_hi - W + 1 - first, BN), 0), n_win)
        return n_loc, n_init, n_loc + n_init + n_win, first, s_local, n_edge

    @gluon.jit
    def _key_tile(j, n_loc, n_init, first, s_local, BN: gl.constexpr):
        """The first key of step ``j``'s tile: the local blocks', the initial blocks', then the window's."""
        tile = gl.where(j < n_loc, s_local + j * BN, (j - n_loc) * BN)
        return gl.where(j < n_loc + n_init, tile, first + (j - n_loc - n_init) * BN)

    @gluon.jit
    def _copy_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_free, kv_ready, kv_empty, T, TK,
                        q_offset, W, n_items, H: gl.constexpr, G: gl.constexpr, INIT: gl.constexpr,
                        LOCAL: gl.constexpr, FORCED: gl.constexpr, STAGES: gl.constexpr):
        """One warp: each item's ``q`` rows (one copy a position; positions past the last query copy the
        last one's) once both warpgroups have released the previous item's, then each step's key tile
        into its slot once both warpgroups have released it; ``g`` counts the ring's steps."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DH: gl.constexpr = k_desc.block_type.shape[1]
        BT: gl.constexpr = q_smem.shape[1] // G
        g = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_b, i_h, pair = head_item(item, gl.cdiv(T, 2 * BT), H)
            i0 = pair * 2 * BT
            n_loc, n_init, steps, first, s_local, n_edge = _steps(pair, T, q_offset, W, BT, BN, INIT, LOCAL, FORCED)
            mbarrier.wait(q_free, it & 1)
            mbarrier.expect(q_ready, 2 * BT * q_desc.block_type.nbytes)
            for p in gl.static_range(2 * BT):
                row = ((i_b * T + gl.minimum(i0 + p, T - 1)) * H + i_h) * G
                tma_load(q_desc, [row, 0], q_ready, q_smem.index(p // BT).slice((p % BT) * G, G))
            for j in range(steps):
                fill_key_slot(k_desc, v_desc, k_smem, v_smem, kv_ready, kv_empty, g + j, i_b * TK + _key_tile(j, n_loc, n_init, first, s_local, BN),
                              i_h * DH, STAGES)
            g += steps
            it += 1

    @gluon.jit
    def _store_finished(o, lse, acc, m, l, o_row, m_row, acc_layout: gl.constexpr):
        """``o = acc / l`` (in ``o``'s dtype) and the log2-domain ``lse = m + log2 l`` of the rows
        ``o_row`` (flat ``[B T HQ]`` indices) where ``m_row``; a row that saw nothing gets 0 and -inf
        (``attn_fwd_finish``'s rule)."""
        DH: gl.constexpr = acc.shape[1]
        seen = l > 0
        l_safe = gl.where(seen, l, 1.0)
        gl.store(lse + o_row, gl.where(seen, m + gl.log2(l_safe), float("-inf")), mask=m_row)
        inv = gl.expand_dims(gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, acc_layout)), 1)
        rows = gl.expand_dims(gl.convert_layout(o_row, gl.SliceLayout(1, acc_layout)), 1)
        cols = gl.expand_dims(gl.arange(0, DH, layout=gl.SliceLayout(0, acc_layout)), 0)
        mask = gl.expand_dims(gl.convert_layout(m_row, gl.SliceLayout(1, acc_layout)), 1) & (cols < DH)
        gl.store(o + rows * DH + cols, (acc * inv).to(o.dtype.element_ty), mask=mask)

    @gluon.jit
    def _keep_local(j, acc, m, l, acc_a, m_a, l_a, n_loc):
        """Before step ``j``: after the local blocks' steps, their state kept aside (the window's) while
        it goes on as the selected branch's. Returns the kept state."""
        if j == n_loc:
            acc_a, m_a, l_a = acc, m, l
        return acc_a, m_a, l_a

    @gluon.jit
    def _finish_forced(j, acc, m, l, acc_a, m_a, l_a, o_frc, lse_frc, o_row, m_row, n_loc, n_init,
                       acc_layout: gl.constexpr):
        """Before step ``j``: after the initial blocks' steps, the selected branch's state stored
        (``o_frc``, ``lse_frc``: the selected forward's start) and the window's taken back. Returns the
        running state."""
        if j == n_loc + n_init:
            _store_finished(o_frc, lse_frc, acc, m, l, o_row, m_row, acc_layout)
            acc, m, l = acc_a, m_a, l_a
        return acc, m, l

    @gluon.jit
    def _softmax(s, j, acc, m, l, n_loc, n_init, first, s_local, o_n, pos, W, qk_scale, FORCED: gl.constexpr,
                 MASK: gl.constexpr, acc_layout: gl.constexpr):
        """Step ``j``'s online-softmax update (``attn_fwd_step``'s arithmetic) from its raw scores ``s``:
        ``(p, acc * alpha, m, l)``. ``MASK`` 2: the band masks every step but the initial blocks' (before
        every row); 1: the band; 0: none (every key of the tile lies in every row's band, or before it)."""
        BN: gl.constexpr = s.shape[1]
        if MASK > 0:
            key = gl.expand_dims(_key_tile(j, n_loc, n_init, first, s_local, BN) + o_n, 0)  # [1, BN]
            visible = (key <= pos) & (key > pos - W)
            if FORCED and MASK == 2:
                visible = visible | ((j >= n_loc) & (j < n_loc + n_init))
            s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, 1) * qk_scale)
        shift = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing shifts by 0
        p = gl.exp2(s * qk_scale - gl.expand_dims(shift, 1))
        alpha = gl.exp2(m - shift)
        l = l * alpha + gl.sum(p, 1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc_layout)), 1)
        return p, acc, m_new, l

    @gluon.jit
    def _step(j, g, s, acc, m, l, q, k_smem, v_smem, kv_ready, kv_empty, s_zero, n_loc, n_init, first, s_local, o_n,
              pos, W, qk_scale, FORCED: gl.constexpr, MASK: gl.constexpr, STAGES: gl.constexpr,
              acc_layout: gl.constexpr, a_layout: gl.constexpr):
        """Ring step ``g + j``: issue the next tile's ``S = Q K^T``, turn this tile's scores ``s`` into
        its probabilities (:func:`_softmax`, ``MASK``) while that runs, issue ``acc += P V``, wait for
        both and release the slot. Returns the next tile's scores and the running state."""
        slot = (g + j) % STAGES
        nxt = (g + j + 1) % STAGES
        mbarrier.wait(kv_ready.index(nxt), ((g + j + 1) // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        p, acc, m, l = _softmax(s, j, acc, m, l, n_loc, n_init, first, s_local, o_n, pos, W, qk_scale, FORCED, MASK,
                                acc_layout)
        acc = warpgroup_mma(gl.convert_layout(p.to(k_smem.dtype), a_layout), v_smem.index(slot), acc, is_async=True)
        s, acc = warpgroup_mma_wait(0, deps=(s_tok, acc))
        mbarrier.arrive(kv_empty.index(slot))
        return s, acc, m, l

    @gluon.jit
    def _compute_partition(o, lse, o_frc, lse_frc, q_smem, k_smem, v_smem, q_ready, q_free, kv_ready, kv_empty, T,
                           q_offset, W, qk_scale, n_items, H: gl.constexpr, G: gl.constexpr, INIT: gl.constexpr,
                           LOCAL: gl.constexpr, FORCED: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr):
        """Warpgroup ``WG``'s 64 rows of each of the program's items over the item's key tiles, then their
        ``o`` and ``lse`` (and, with ``FORCED``, the selected branch's), a step in the module docstring's
        order; ``g`` counts the ring's steps as the copy warp does."""
        M: gl.constexpr = q_smem.shape[1]
        DH: gl.constexpr = q_smem.shape[2]
        BN: gl.constexpr = k_smem.shape[1]
        BT: gl.constexpr = M // G
        s_layout: gl.constexpr = wgmma_layout(BN)
        acc_layout: gl.constexpr = wgmma_layout(DH)
        a_layout: gl.constexpr = a_operand_layout(acc_layout)
        HQ: gl.constexpr = H * G
        o_m = gl.arange(0, M, layout=gl.SliceLayout(1, s_layout))
        o_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        q = q_smem.index(WG)
        s_zero = gl.zeros([M, BN], gl.float32, layout=s_layout)
        g = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_b, i_h, pair = head_item(item, gl.cdiv(T, 2 * BT), H)
            n_loc, n_init, steps, first, s_local, n_edge = _steps(pair, T, q_offset, W, BT, BN, INIT, LOCAL, FORCED)
            t_m = pair * 2 * BT + WG * BT + o_m // G
            m_row = t_m < T
            o_row = (i_b.to(gl.int64) * T + t_m) * HQ + i_h * G + o_m % G
            pos = gl.expand_dims(q_offset + t_m, 1)  # [M, 1]
            acc = gl.zeros([M, DH], gl.float32, layout=acc_layout)
            m = gl.full([M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
            l = gl.zeros([M], gl.float32, layout=gl.SliceLayout(1, s_layout))
            acc_a, m_a, l_a = acc, m, l  # the window's state, kept aside while the initial blocks run
            mbarrier.wait(q_ready, it & 1)
            # steps >= 1: every query's band holds its own key
            mbarrier.wait(kv_ready.index(g % STAGES), (g // STAGES) & 1)
            s = warpgroup_mma(q, k_smem.index(g % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s,))
            # the steps in phases, a loop each, so that a step carries neither the states' switches nor a
            # mask its phase does not need (the arithmetic of one loop over generic steps, bit for bit)
            if FORCED:
                b1 = gl.minimum(n_loc, steps - 1)
                b2 = gl.minimum(n_loc + n_init, steps - 1)
                b3 = gl.minimum(b2 + n_edge, steps - 1)
                for j in range(0, b1):  # the local blocks: the band
                    s, acc, m, l = _step(j, g, s, acc, m, l, q, k_smem, v_smem, kv_ready, kv_empty, s_zero, n_loc,
                                         n_init, first, s_local, o_n, pos, W, qk_scale, FORCED, 1, STAGES, acc_layout,
                                         a_layout)
                acc_a, m_a, l_a = _keep_local(b1, acc, m, l, acc_a, m_a, l_a, n_loc)
                for j in range(b1, b2):  # the initial blocks, before every row
                    s, acc, m, l = _step(j, g, s, acc, m, l, q, k_smem, v_smem, kv_ready, kv_empty, s_zero, n_loc,
                                         n_init, first, s_local, o_n, pos, W, qk_scale, FORCED, 0, STAGES, acc_layout,
                                         a_layout)
                acc, m, l = _finish_forced(b2, acc, m, l, acc_a, m_a, l_a, o_frc, lse_frc, o_row, m_row, n_loc,
                                           n_init, acc_layout)
                for j in range(b2, b3):  # the window's tiles that reach below the last query's band
                    s, acc, m, l = _step(j, g, s, acc, m, l, q, k_smem, v_smem, kv_ready, kv_empty, s_zero, n_loc,
                                         n_init, first, s_local, o_n, pos, W, qk_scale, FORCED, 1, STAGES, acc_layout,
                                         a_layout)
                for j in range(b3, steps - 1):  # inside every row's band, before its own block
                    s, acc, m, l = _step(j, g, s, acc, m, l, q, k_smem, v_smem, kv_ready, kv_empty, s_zero, n_loc,
                                         n_init, first, s_local, o_n, pos, W, qk_scale, FORCED, 0, STAGES, acc_layout,
                                         a_layout)
            else:
                for j in range(steps - 1):
                    s, acc, m, l = _step(j, g, s, acc, m, l, q, k_smem, v_smem, kv_ready, kv_empty, s_zero, n_loc,
                                         n_init, first, s_local, o_n, pos, W, qk_scale, FORCED, 1, STAGES, acc_layout,
                                         a_layout)
            mbarrier.arrive(q_free)  # the item's products that read q are done
            last = (g + steps - 1) % STAGES
            p, acc, m, l = _softmax(s, steps - 1, acc, m, l, n_loc, n_init, first, s_local, o_n, pos, W, qk_scale,
                                    FORCED, 2, acc_layout)
            acc = warpgroup_mma(gl.convert_layout(p.to(q_smem.dtype), a_layout), v_smem.index(last), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(kv_empty.index(last))  # the ring runs on into the next item
            if FORCED:  # the switches that steps ending before the window's own tiles left undone
                acc_a, m_a, l_a = _keep_local(steps, acc, m, l, acc_a, m_a, l_a, n_loc)
                acc, m, l = _finish_forced(steps, acc, m, l, acc_a, m_a, l_a, o_frc, lse_frc, o_row, m_row, n_loc,
                                           n_init, acc_layout)
            _store_finished(o, lse, acc, m, l, o_row, m_row, acc_layout)
            g += steps
            it += 1

    @gluon.jit
    def window_fwd_gluon_kernel(
        q_desc, k_desc, v_desc,  # q [B*T*HQ, D] (G rows a copy), k/v [B*TK, H*D] (64 keys a copy)
        o, lse, o_frc, lse_frc,
        T, TK, q_offset, W, qk_scale, n_items,
        H: gl.constexpr, G: gl.constexpr, INIT: gl.constexpr, LOCAL: gl.constexpr, FORCED: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """Grid ``(programs,)``, at most one an SM, over ``n_items`` pairs of query tiles (``B H`` times
        ``cdiv(T, 2 BT)``), ``num_warps=4`` (the default partition is warpgroup 0), ``maxnreg=168``: the
        computing warpgroups get 240 registers, the copy warp 24."""
        DH: gl.constexpr = q_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        M: gl.constexpr = 64  # rows a warpgroup
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, M, DH], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, DH], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, DH], v_desc.layout)
        q_ready, kv_ready, kv_empty = ring_barriers(STAGES, 2)  # the consumers: both warpgroups
        q_free = released_barrier(2)  # both warpgroups, once an item's products that read q are done
        WG0: gl.constexpr = 0
        WG1: gl.constexpr = 1
        gl.warp_specialize([
            (_compute_partition, (o, lse, o_frc, lse_frc, q_smem, k_smem, v_smem, q_ready, q_free, kv_ready, kv_empty,
                                  T, q_offset, W, qk_scale, n_items, H, G, INIT, LOCAL, FORCED, WG0, STAGES)),
            (_compute_partition, (o, lse, o_frc, lse_frc, q_smem, k_smem, v_smem, q_ready, q_free, kv_ready, kv_empty,
                                  T, q_offset, W, qk_scale, n_items, H, G, INIT, LOCAL, FORCED, WG1, STAGES)),
            (_copy_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_free, kv_ready, kv_empty, T,
                               TK, q_offset, W, n_items, H, G, INIT, LOCAL, FORCED, STAGES)),
        ], [4, 1], [240, 24])


def window_fwd_gluon(q, k, v, o, lse, o_frc, lse_frc, T: int, q_offset: int, window: int, qk_scale: float,
                     forced: tuple) -> None:
    """Launch the kernel: ``o [B, T, HQ, D]`` (q's dtype) and the log2-domain ``lse [B, T, HQ]``
    (float32), and with ``forced`` ``(FORCED, INIT, LOCAL)`` on, the selected branch's ``o_frc`` and
    ``lse_frc`` over its forced blocks (placeholders otherwise); inputs contiguous. A Triton whose Gluon
    cannot build it raises naming the flag that turns it off."""
    B, _, HQ, _ = q.shape
    TK, H = k.shape[1], k.shape[2]
    G = HQ // H
    q_desc, k_desc, v_desc = launch_descriptors((q,), (k, v), KEYS)
    n_items, grid = head_items_grid(B, H, -(-T // (2 * ROWS // G)), q.device)
    try:
        window_fwd_gluon_kernel[grid](q_desc, k_desc, v_desc, o, lse, o_frc, lse_frc, T, TK, q_offset, window, qk_scale,
                                      n_items, H=H, G=G, INIT=forced[1], LOCAL=forced[2], FORCED=forced[0], STAGES=STAGES,
                                      **LAUNCH_OPTIONS)
    except Exception as exc:  # Gluon is experimental: its API moves between Triton releases
        raise launch_failed("the window forward", "NSA_GLUON_WINDOW_FWD", exc) from exc


def compile_for_hopper(G: int = 16, forced: bool = True, dtype: torch.dtype = torch.bfloat16):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU: what
    :func:`window_fwd_gluon` would launch for ``G`` query heads a KV head (head dim 128), with the NSA
    prefill's forced blocks or without. Returns Triton's compiled kernel (``asm``, ``metadata``)."""
    D = 128
    values = dict(H=4, G=G, INIT=1, LOCAL=2, FORCED=forced, STAGES=STAGES)
    el = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    signature = {**descriptor_signature(dtype, G, KEYS, ("q_desc",), ("k_desc", "v_desc"), D),
                 "o": el, "lse": "*fp32", "o_frc": el, "lse_frc": "*fp32",
                 "T": "i32", "TK": "i32", "q_offset": "i32", "W": "i32", "qk_scale": "fp32", "n_items": "i32",
                 **{name: "constexpr" for name in values}}
    return compile_for_sm90(window_fwd_gluon_kernel, signature, values, LAUNCH_OPTIONS)
