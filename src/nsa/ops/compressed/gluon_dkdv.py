"""The compressed branch's dK/dV on Hopper, warp-specialised (Gluon): the same function as
``compressed_bwd_dkdv_kernel`` with ``DS_OUT`` (:mod:`nsa.ops.compressed.kernel`), in another form.

Why: that kernel is the longest of the 64k forward+backward on the H200 (21.6 of 96 ms in session
60). Its Triton loop issues each product and waits for it, and its 8 warps load, compute and store
in step. Session 61's probe (``scripts/gpu_gluon_bwd_probe.py``) measured this form 1.20x as fast
on the same step with the ``dS`` stores (8.64 against 10.37 ms): one warp copies each query tile's
``q`` and ``do`` by TMA into a ring of slots, and two warpgroups of 64 tokens each compute. A
warpgroup issues a tile's two gradient products (``dV += P^T dO``, ``dK += dS^T Q``), stores its
``dS^T`` by TMA, issues the next tile's two score products (``S^T = K Q^T``, ``dP^T = V dO^T``),
and only then waits for all four.

A program is ``compressed_bwd_dkdv_kernel``'s (token tile of 128, query chunk, batch and KV head;
the same grid and chunks) and walks the same query tiles in the same order; every tile's ``P`` is
masked by each row's visible tokens, which leaves the tiles that see the whole token tile as they
are. ``dK``/``dV`` and ``dS`` go where that kernel puts them.

Where the library kernel differs from the probe's step is in what each tile needs besides ``q`` and
``do``: its rows' lse, delta and gate, and where its ``dS`` tile goes. Read from global memory by the
computing warpgroups after each wait, they put a load's latency on every step's path: the kernel took
25.2 ms at 64k against the Triton kernel's 21.8 (session 61). The copy warp now stages the row vectors
in shared memory with the tile (the slot's barrier waits for them too), and the ``dS`` offset of the
next tile is read while its products run.

Gluon has no CPU interpreter: the kernel runs on Hopper GPUs only, where the GPU tests compare it with
the Triton kernel (``tests/ops/test_gluon_dkdv.py``); the CPU tests compile it for sm_90 with the
installed Triton (:func:`compile_for_hopper`). :func:`fits` says where it applies.

Measured (session 63, H200, Triton 3.6; ``scripts/gpu_session63.sh variants``): 4 ring slots and one
``dS`` buffer a warpgroup (217 KiB) against session 62's 3 slots and two (201 KiB), the same gradients
bit for bit: the kernel 17.95-18.05 ms at 64k against 19.10-19.18, 0.405-0.410 against 0.431-0.434 at
8k; the whole 64k forward+backward 93.24-93.49 ms against 93.56-94.10 in four ABBA rounds. The
visibility mask computed only on the tiles that need it was slower (19.64-19.69 ms: more spills).

Measured (session 62, 3 slots; ``scripts/gpu_session62.sh rowvec``): dq, dk and dv within
bf16 rounding of the Triton path's; the kernel 19.53-19.54 ms at 64k against 21.84-21.91 (1.12x),
0.431 against 0.502-0.511 at 8k (1.17x); the whole 64k forward+backward 94.17-94.68 ms against
96.31-96.67 in four ABBA rounds, the 8k one the same (7.10-7.21 against 7.10-7.26). ptxas serialises
its wgmma for want of registers (note C7512); the form without (``P^T`` and ``dS^T`` from shared
memory, 2 slots) took 28.2 ms at 64k. Compiles for sm_90 with Triton 3.6, 3.7.1, 3.8.0 and 3.9.0
(217 KiB of shared memory, 48-60 bytes spilled with Triton 3.6).
"""

from __future__ import annotations

import torch

from nsa import flags
from nsa.ops._gluon import PAIR_LAUNCH as LAUNCH_OPTIONS  # two computing warpgroups, a copy warp
from nsa.ops._gluon import (a_operand_layout, compile_for_sm90, copies_fit, descriptor_type, element_type,
                            fence_async_shared, gl, gluon, head_rows_descriptor, key_rows_descriptor, launch_failed,
                            mbarrier, on_hopper, ring_barriers, TensorDescriptor, tma, tma_load, tma_store,
                            warpgroup_mma, warpgroup_mma_wait, wgmma_layout)

#: Tokens a computing warpgroup owns (two a program: the Triton kernel's token tile of 128).
TOKENS_PER_WARPGROUP = 64
#: Query rows a step ((position, head) pairs of one KV group), as the Triton kernel's Hopper tiles.
ROWS = 64
#: Slots of the ``q``/``do`` ring (the probe: 4 stages 8.64 ms, 2 stages 9.16; in place at 64k, 4
#: slots and one ``dS`` buffer 17.95-18.05 ms against 19.10-19.18 for 3 slots and two: session 63).
STAGES = 4
#: Buffers of each warpgroup's ``dS`` tiles: one (its TMA store, issued a step earlier, is waited for
#: before the next tile is written), so that 4 ring slots fit beside the row vectors' slots.
DS_BUFFERS = 1


def fits(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, do: torch.Tensor, kv_tiles: dict,
         has_ds: bool) -> bool:
    """Whether this kernel replaces the Triton dK/dV: ``NSA_GLUON_COMPRESSED_DKDV`` on, Gluon
    importable, ``dS`` stored for the dQ, a Hopper GPU (compute capability 9), and inputs and tiles
    it takes (:func:`shapes_fit`)."""
    return (flags.get("NSA_GLUON_COMPRESSED_DKDV") and has_ds and on_hopper(q)
            and shapes_fit(q, k_cmp, v_cmp, do, kv_tiles))


def shapes_fit(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, do: torch.Tensor, kv_tiles: dict) -> bool:
    """Contiguous 16-bit inputs with 128-wide heads (the TMA copies take them as row matrices), the
    Triton kernel's Hopper tiles (64 rows of 8-64 heads, 128 tokens: ``kv_tiles``' ``GP``, ``BT``,
    ``BN``), and whole query tiles (``TQ`` a multiple of the tile's positions)."""
    G = copies_fit(q, k_cmp, v_cmp, do)
    return (G > 0 and kv_tiles["GP"] == G and kv_tiles["BT"] * G == ROWS
            and kv_tiles["BN"] == 2 * TOKENS_PER_WARPGROUP and q.shape[1] % kv_tiles["BT"] == 0)


if gluon is not None:

    @gluon.jit
    def _tile_walk(j, n_unmasked, i_z, i_u):
        """Query tile of step ``j``: the Triton kernel's order, its unmasked tiles from the chunk's end
        down, then its masked ones."""
        return gl.where(j < n_unmasked, i_z - 1 - j, i_u - 1 - (j - n_unmasked))

    @gluon.jit
    def _chunk(TQ, q_offset, i_n, i_s, L: gl.constexpr, S: gl.constexpr, BT: gl.constexpr, BN: gl.constexpr,
               SPLIT: gl.constexpr):
        """``(steps, unmasked steps, i_z, i_u)`` of token tile ``i_n``'s chunk ``i_s`` (the Triton kernel's
        ranges: query tiles ``[i_m, i_z)`` see the whole token tile, ``[i_a, i_u)`` part of it; the same
        arithmetic as that kernel's, kept in step with it by the GPU tests: Gluon cannot call Triton
        functions)."""
        NT = gl.cdiv(TQ, BT)
        i_lo = gl.maximum(i_n * BN * S + L - 1 - q_offset, 0) // BT
        i_full = gl.minimum(gl.cdiv(gl.maximum((i_n * BN + BN - 1) * S + L - 1 - q_offset, 0), BT), NT)
        seg = gl.cdiv(NT, SPLIT)
        i_a = gl.maximum(i_lo, i_s * seg)
        i_z = gl.minimum(i_s * seg + seg, NT)
        i_m = gl.maximum(i_a, i_full)
        i_u = gl.minimum(i_z, i_full)
        n_unmasked = gl.maximum(i_z - i_m, 0)
        return n_unmasked + gl.maximum(i_u - i_a, 0), n_unmasked, i_z, i_u

    @gluon.jit
    def _copy_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                        qdo_ready, qdo_empty, lse, delta, gate, TQ, NC, q_offset, H: gl.constexpr, G: gl.constexpr,
                        L: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr, GATED: gl.constexpr,
                        STAGES: gl.constexpr):
        """One warp: both warpgroups' keys and values, then each step's ``q`` and ``do`` rows (one copy
        per position: a position's ``G`` heads are contiguous) into the step's slot, once both
        warpgroups have released the slot's previous step (its barrier starts with that phase done),
        and the step's row vectors (lse, delta, gate) into the slot's ``rows_smem``: loaded here, off
        the computing warpgroups' path (read by them after each wait, they kept the kernel at 25.2 ms
        at 64k where the probe's step, which loads none, ran 1.20x Triton's)."""
        BNW: gl.constexpr = k_desc.block_type.shape[0]
        DH: gl.constexpr = k_desc.block_type.shape[1]
        BT: gl.constexpr = q_smem.shape[1] // G
        i_n = gl.program_id(0)
        i_s = gl.program_id(1)
        i_b = gl.program_id(2) // H
        i_h = gl.program_id(2) % H
        steps, n_unmasked, i_z, i_u = _chunk(TQ, q_offset, i_n, i_s, L, S, BT, 2 * BNW, SPLIT)
        mbarrier.expect(kv_bar, 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for c in gl.static_range(2):
            tma_load(k_desc, [i_b * NC + i_n * 2 * BNW + c * BNW, i_h * DH], kv_bar, k_smem.index(c))
            tma_load(v_desc, [i_b * NC + i_n * 2 * BNW + c * BNW, i_h * DH], kv_bar, v_smem.index(c))
        M: gl.constexpr = q_smem.shape[1]
        o_m = gl.arange(0, M, layout=gl.BlockedLayout([M // 32], [32], [1], [0]))
        for j in range(steps):
            slot = j % STAGES
            i = _tile_walk(j, n_unmasked, i_z, i_u)
            row0 = ((i_b * TQ + i * BT) * H + i_h) * G
            mbarrier.wait(qdo_empty.index(slot), (j // STAGES) & 1)
            bar = qdo_ready.index(slot)
            mbarrier.expect(bar, BT * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
            for p in gl.static_range(BT):
                tma_load(q_desc, [row0 + p * H * G, 0], bar, q_smem.index(slot).slice(p * G, G))
                tma_load(do_desc, [row0 + p * H * G, 0], bar, do_smem.index(slot).slice(p * G, G))
            # the row vectors, then the barrier's second arrival: whoever waits on it sees them
            o_q = _rows(i_b, i_h, i, TQ, o_m, H, G)
            rows_smem.index(4 * slot).store(gl.load(lse + o_q))
            rows_smem.index(4 * slot + 1).store(gl.load(delta + o_q))
            if GATED:
                rows_smem.index(4 * slot + 2).store(gl.load(gate + o_q))
            mbarrier.arrive(bar)

    @gluon.jit
    def _rows(i_b, i_h, i, TQ, o_m, H: gl.constexpr, G: gl.constexpr):
        """Flat ``[B * TQ * HQ]`` rows of query tile ``i``'s rows ``o_m`` (position-major)."""
        BT: gl.constexpr = o_m.shape[0] // G
        return (i_b.to(gl.int64) * TQ + i * BT + o_m // G) * (H * G) + i_h * G + o_m % G

    @gluon.jit
    def _gradients(st, dpt, rows_smem, slot, i, o_m, o_n, q_offset, NC, qk_scale, G: gl.constexpr,
                   L: gl.constexpr, S: gl.constexpr, GATED: gl.constexpr, dtype: gl.constexpr):
        """Query tile ``i``'s ``P^T`` (masked by each row's visible tokens, gated) and ``dS^T``, both in
        ``dtype``, from its scores ``st`` and ``dpt``; the rows' lse (0 where it is -inf: such rows see
        no token), delta and gate from slot ``slot`` of ``rows_smem`` (the copy warp's)."""
        BT: gl.constexpr = o_m.shape[0] // G
        b_lse = rows_smem.index(4 * slot).load(o_m.type.layout)
        b_lse = gl.where(b_lse == float("-inf"), 0.0, b_lse * 1.4426950408889634)  # natural log to log2
        pt = gl.exp2(st * qk_scale - gl.expand_dims(b_lse, 0))
        t = q_offset + i * BT + o_m // G
        seen = gl.minimum(gl.where(t + 1 >= L, (t + 1 - L) // S + 1, 0), NC)
        pt = gl.where(gl.expand_dims(o_n, 1) < gl.expand_dims(seen, 0), pt, 0.0)
        if GATED:
            pt = pt * gl.expand_dims(rows_smem.index(4 * slot + 2).load(o_m.type.layout), 0)
        dst = pt * (dpt - gl.expand_dims(rows_smem.index(4 * slot + 1).load(o_m.type.layout), 0))
        return pt.to(dtype), dst.to(dtype)

    @gluon.jit
    def _compute_partition(ds_desc, dk, dv, ds_off, q_smem, do_smem, k_smem, v_smem, ds_smem, rows_smem,
                           kv_bar, qdo_ready, qdo_empty, TQ, NC, q_offset, TOTAL, qk_scale, scale,
                           H: gl.constexpr, G: gl.constexpr, L: gl.constexpr, S: gl.constexpr,
                           SPLIT: gl.constexpr, GATED: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr):
        """Warpgroup ``WG``'s 64 tokens over the chunk's query tiles (the module's docstring gives a
        step's order); then its ``dK`` (times ``scale``) and ``dV`` rows of the chunk's partial sums."""
        M: gl.constexpr = q_smem.shape[1]
        DH: gl.constexpr = q_smem.shape[2]
        BNW: gl.constexpr = k_smem.shape[1]
        BT: gl.constexpr = M // G
        st_layout: gl.constexpr = wgmma_layout(M)
        acc_layout: gl.constexpr = wgmma_layout(DH)
        a_layout: gl.constexpr = a_operand_layout(acc_layout)
        i_n = gl.program_id(0)
        i_s = gl.program_id(1)
        i_b = gl.program_id(2) // H
        i_h = gl.program_id(2) % H
        steps, n_unmasked, i_z, i_u = _chunk(TQ, q_offset, i_n, i_s, L, S, BT, 2 * BNW, SPLIT)
        n0 = i_n * 2 * BNW + WG * BNW  # the warpgroup's first token
        o_n = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, st_layout))
        o_m = gl.arange(0, M, layout=gl.SliceLayout(0, st_layout))
        ds_row0 = (i_b * H + i_h).to(gl.int64) * TOTAL + n0
        k = k_smem.index(WG)
        v = v_smem.index(WG)
        dk_acc = gl.zeros([BNW, DH], gl.float32, layout=acc_layout)
        dv_acc = gl.zeros([BNW, DH], gl.float32, layout=acc_layout)
        st_zero = gl.zeros([BNW, M], gl.float32, layout=st_layout)
        mbarrier.wait(kv_bar, 0)
        if steps > 0:
            mbarrier.wait(qdo_ready.index(0), 0)
            s_tok = warpgroup_mma(k, q_smem.index(0).permute((1, 0)), st_zero, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(v, do_smem.index(0).permute((1, 0)), st_zero, use_acc=False, is_async=True)
            i = _tile_walk(0, n_unmasked, i_z, i_u)
            ds_row = ds_row0 + gl.load(ds_off + i)
            st, dpt = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
            for j in range(steps - 1):
                slot = j % STAGES
                nxt = (j + 1) % STAGES
                pt, dst = _gradients(st, dpt, rows_smem, slot, i, o_m, o_n, q_offset, NC, qk_scale, G, L, S,
                                     GATED, q_smem.dtype)
                dv_acc = warpgroup_mma(gl.convert_layout(pt, a_layout), do_smem.index(slot), dv_acc, is_async=True)
                dk_acc = warpgroup_mma(gl.convert_layout(dst, a_layout), q_smem.index(slot), dk_acc, is_async=True)
                # before the next score products: stored after them, the dS tiles cost the probe 2.4 ms
                # where Triton's stores cost 1.4
                _store_ds(ds_desc, ds_smem, dst, ds_row, j)
                mbarrier.wait(qdo_ready.index(nxt), ((j + 1) // STAGES) & 1)
                s_tok = warpgroup_mma(k, q_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False, is_async=True)
                dp_tok = warpgroup_mma(v, do_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False,
                                       is_async=True)
                i = _tile_walk(j + 1, n_unmasked, i_z, i_u)
                ds_row = ds_row0 + gl.load(ds_off + i)  # read while the products run
                st, dpt, dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(s_tok, dp_tok, dv_acc, dk_acc))
                mbarrier.arrive(qdo_empty.index(slot))
            last = (steps - 1) % STAGES
            pt, dst = _gradients(st, dpt, rows_smem, last, i, o_m, o_n, q_offset, NC, qk_scale, G, L, S, GATED,
                                 q_smem.dtype)
            dv_acc = warpgroup_mma(gl.convert_layout(pt, a_layout), do_smem.index(last), dv_acc, is_async=True)
            dk_acc = warpgroup_mma(gl.convert_layout(dst, a_layout), q_smem.index(last), dk_acc, is_async=True)
            _store_ds(ds_desc, ds_smem, dst, ds_row, steps - 1)
            tma.store_wait(0)
            dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc))
        o_r = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, acc_layout))
        o_d = gl.arange(0, DH, layout=gl.SliceLayout(0, acc_layout))
        # partial sums of chunk i_s: [SPLIT, B, NC, H, DH]
        o_kv = ((i_s * (gl.num_programs(2) // H) + i_b).to(gl.int64) * NC + o_r) * H + i_h
        offs = gl.expand_dims(o_kv * DH, 1) + gl.expand_dims(o_d, 0)
        m_r = gl.expand_dims(o_r < NC, 1) & gl.expand_dims(o_d < DH, 0)
        gl.store(dk + offs, (dk_acc * scale).to(dk.dtype.element_ty), mask=m_r)
        gl.store(dv + offs, dv_acc.to(dv.dtype.element_ty), mask=m_r)

    @gluon.jit
    def _store_ds(ds_desc, ds_smem, dst, row, j):
        """Step ``j``'s ``dS^T`` tile out by a TMA store from buffer ``j % buffers``, once that buffer's
        last store has been read out."""
        DS_BUFFERS: gl.constexpr = ds_smem.shape[0]
        buf = ds_smem.index(j % DS_BUFFERS)
        tma.store_wait(DS_BUFFERS - 1)
        buf.store(dst)
        fence_async_shared()
        tma_store(ds_desc, [row.to(gl.int32), 0], buf)

    @gluon.jit
    def compressed_bwd_dkdv_gluon_kernel(
        q_desc, do_desc, k_desc, v_desc, ds_desc,  # q/do [B*TQ*HQ, D] (G rows a copy), k/v [B*NC, H*D], ds [rows, M]
        dk, dv, lse, delta, gate, ds_off,
        TQ, NC, q_offset, TOTAL, qk_scale, scale,
        H: gl.constexpr, G: gl.constexpr, L: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
        GATED: gl.constexpr, STAGES: gl.constexpr, DS_BUFFERS: gl.constexpr,
    ):
        """Grid ``(token tiles of 128, SPLIT, B * H)``, ``num_warps=4`` (the default partition is
        warpgroup 0), ``maxnreg=168``: the computing warpgroups get 240 registers, the copy warp 24."""
        DH: gl.constexpr = q_desc.block_type.shape[1]
        BNW: gl.constexpr = k_desc.block_type.shape[0]
        M: gl.constexpr = ds_desc.block_type.shape[1]
        # the descriptors copy G rows at a time into [M, DH] slots of the same swizzled layout
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, M, DH], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, M, DH], do_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, BNW, DH], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, BNW, DH], v_desc.layout)
        ds0_smem = gl.allocate_shared_memory(ds_desc.dtype, [DS_BUFFERS, BNW, M], ds_desc.layout)
        ds1_smem = gl.allocate_shared_memory(ds_desc.dtype, [DS_BUFFERS, BNW, M], ds_desc.layout)
        # slot s's row vectors in rows 4 s (lse), 4 s + 1 (delta), 4 s + 2 (gate): shapes are powers of two
        gl.static_assert(STAGES <= 4)
        rows_smem = gl.allocate_shared_memory(gl.float32, [16, M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        kv_bar, qdo_ready, qdo_empty = ring_barriers(STAGES, 2)  # the consumers: both warpgroups
        WG0: gl.constexpr = 0
        WG1: gl.constexpr = 1
        gl.warp_specialize([
            (_compute_partition, (ds_desc, dk, dv, ds_off, q_smem, do_smem, k_smem, v_smem, ds0_smem, rows_smem,
                                  kv_bar, qdo_ready, qdo_empty, TQ, NC, q_offset, TOTAL, qk_scale, scale,
                                  H, G, L, S, SPLIT, GATED, WG0, STAGES)),
            (_compute_partition, (ds_desc, dk, dv, ds_off, q_smem, do_smem, k_smem, v_smem, ds1_smem, rows_smem,
                                  kv_bar, qdo_ready, qdo_empty, TQ, NC, q_offset, TOTAL, qk_scale, scale,
                                  H, G, L, S, SPLIT, GATED, WG1, STAGES)),
            (_copy_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                               qdo_ready, qdo_empty, lse, delta, gate, TQ, NC, q_offset, H, G, L, S, SPLIT, GATED,
                               STAGES)),
        ], [4, 1], [240, 24])




def _layouts(dtype: torch.dtype, D: int):
    """Shared layouts of the ``q``/``do`` step tiles, the key/value tiles and the ``dS^T`` tiles."""
    el = element_type(dtype)
    return (gl.NVMMASharedLayout.get_default_for([ROWS, D], el),
            gl.NVMMASharedLayout.get_default_for([TOKENS_PER_WARPGROUP, D], el),
            gl.NVMMASharedLayout.get_default_for([TOKENS_PER_WARPGROUP, ROWS], el))


def compressed_bwd_dkdv_gluon(q, k_cmp, v_cmp, do, gate, lse, delta, dk, dv, ds: dict, TQ: int, NC: int,
                              q_offset: int, qk_scale: float, scale: float, split: int, L: int, S: int) -> None:
    """Launch the kernel over ``compressed_bwd_dkdv_kernel``'s grid: ``dk``/``dv`` ``[split, B, NC, H,
    D]`` partial sums (the outputs themselves when ``split == 1``), ``ds`` the dQ's buffer
    (``_ds_buffer``); inputs contiguous, ``gate`` None or float32 ``[B, TQ, HQ]``. A Triton whose
    Gluon cannot build it raises naming the flag that turns it off."""
    B, _, HQ, D = q.shape
    H = k_cmp.shape[2]
    G = HQ // H
    BNW = TOKENS_PER_WARPGROUP
    row_layout, key_layout, ds_layout = _layouts(q.dtype, D)
    ds_rows = ds["buffer"].view(-1, ROWS)
    q_desc, do_desc = (head_rows_descriptor(x, G, row_layout) for x in (q, do))
    k_desc, v_desc = (key_rows_descriptor(x, BNW, key_layout) for x in (k_cmp, v_cmp))
    ds_desc = TensorDescriptor(ds_rows, list(ds_rows.shape), list(ds_rows.stride()), [BNW, ROWS], ds_layout)
    grid = (-(-NC // (2 * BNW)), split, B * H)
    try:
        compressed_bwd_dkdv_gluon_kernel[grid](
            q_desc, do_desc, k_desc, v_desc, ds_desc, dk, dv, lse, delta, lse if gate is None else gate,
            ds["offsets"], TQ, NC, q_offset, ds["total"], qk_scale, scale, H=H, G=G, L=L, S=S, SPLIT=split,
            GATED=gate is not None, STAGES=STAGES, DS_BUFFERS=DS_BUFFERS, **LAUNCH_OPTIONS)
    except Exception as exc:  # Gluon is experimental: its API moves between Triton releases
        raise launch_failed("the compressed dK/dV", "NSA_GLUON_COMPRESSED_DKDV", exc) from exc


def compile_for_hopper(G: int = 16, gated: bool = True, dtype: torch.dtype = torch.bfloat16, split: int = 8):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU: what
    :func:`compressed_bwd_dkdv_gluon` would launch for ``G`` query heads a KV head (head dim 128)
    and the paper's compression geometry. Returns Triton's compiled kernel (``asm``, ``metadata``)."""
    D = 128
    row_layout, key_layout, ds_layout = _layouts(dtype, D)
    values = dict(H=4, G=G, L=32, S=16, SPLIT=split, GATED=gated, STAGES=STAGES, DS_BUFFERS=DS_BUFFERS)
    signature = {"q_desc": descriptor_type(dtype, [G, D], row_layout),
                 "do_desc": descriptor_type(dtype, [G, D], row_layout),
                 "k_desc": descriptor_type(dtype, [TOKENS_PER_WARPGROUP, D], key_layout),
                 "v_desc": descriptor_type(dtype, [TOKENS_PER_WARPGROUP, D], key_layout),
                 "ds_desc": descriptor_type(dtype, [TOKENS_PER_WARPGROUP, ROWS], ds_layout),
                 "dk": "*fp32", "dv": "*fp32", "lse": "*fp32", "delta": "*fp32", "gate": "*fp32", "ds_off": "*i64",
                 "TQ": "i32", "NC": "i32", "q_offset": "i32", "TOTAL": "i64", "qk_scale": "fp32", "scale": "fp32",
                 **{name: "constexpr" for name in values}}
    return compile_for_sm90(compressed_bwd_dkdv_gluon_kernel, signature, values, LAUNCH_OPTIONS)
