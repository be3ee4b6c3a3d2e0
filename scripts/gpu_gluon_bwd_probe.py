"""Would a warp-specialised Gluon kernel shorten the compressed dK/dV? A probe, no library code.

Why: the compressed branch's dK/dV (``compressed_bwd_dkdv_kernel``) is the longest kernel of the
64k forward+backward on the H200 (21.6 of 96.0 ms in session 60), at about 400 TFLOP/s of useful
work where cuDNN's dense backward reaches 524; the 5x target needs 4.9 ms off that step. Session 61's
forward probe (``scripts/gpu_gluon_ws_probe.py``) found a Gluon loop with a copy warp and two
computing warpgroups 7 % faster than Triton's at 2048 keys and 14 % at 8192. This probe asks the
same of the dK/dV loop, whose loops are long (hundreds of query tiles a program).

The problem has the library's dK/dV shape without its causal staircase: per KV group ``g`` (4),
keys and values ``[N, 128]``, rows (``(query, head)`` pairs) ``q`` and ``do`` ``[R, 128]`` with
their log2-domain ``lse`` and ``delta``; a program owns 128 keys of a group and one of ``C`` chunks
of the rows, and walks the chunk 64 rows a step: ``S^T = K Q^T``, ``P^T = exp2(S^T * scale - lse)``,
``dV += P^T dO``, ``dP^T = V dO^T``, ``dS^T = P^T (dP^T - delta)``, ``dK += dS^T Q``, and (with
``DS_OUT``) stores ``dS^T`` as bf16 for a dQ kernel: as ``[4 * N, R]``, or with ``TILED`` in
``[64, 64]`` tiles of 8 KiB each, tile ``(key // 64) * (R // 64) + row // 64`` (the library's dS
tiles are contiguous too, 16 KiB each). ``dK``/``dV`` leave one
float32 partial a chunk.

- ``triton``: the library's step (``attn_bwd_dkdv_ds_step``, the same function) in a loop of
  pointer loads, at the library's Hopper tiles (128 keys, 64 rows, 8 warps, 3 stages).
- ``gluon``: one copy warp (the keys and values once, then each step's ``q`` and ``do`` by TMA into
  a ring of ``STAGES`` slots, a slot refilled once both computing warpgroups released it), and two
  computing warpgroups of 64 keys each. A warpgroup issues step ``j + 1``'s two score products
  right after step ``j``'s two gradient products, waits for all four, releases step ``j``'s slot;
  ``dS^T`` goes out by TMA stores from a pair of shared buffers.

Usage: ``python scripts/gpu_gluon_bwd_probe.py [--keys 4096] [--rows 262144] [--chunks 8]
[--configs I ...]`` (Hopper GPU): each configuration checked against torch (float32) on a small
problem (dK, dV and dS^T), then timed (``do_bench`` median, L2 flushed). ``--compile-only``
compiles the Gluon configurations for sm_90 without a GPU (registers, spills, ptxas's notes).

Session 61, H200 (docs/perf/prefill.md): Triton 10.34-10.44 ms with dS, 9.02-9.09 without; Gluon
without dS 7.24-7.38 (1.24x); with dS stored after the next score products 9.47-9.72, stored before
them (``DS_OUT`` 5, 4 slots) 8.57-8.64 (1.20x); its rows in 4 copies of 16, 9.23.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from gpu_gluon_probe import D, GROUPS, LOG2E, parse_run_arguments, compile_report, descriptor  # scripts/
from nsa.ops._triton.attention import attn_bwd_dkdv_ds_step

#: Computing warpgroups a Gluon program, each with 64 of its 128 keys.
CONSUMERS = gl.constexpr(2)


@triton.jit
def dkdv_triton_kernel(q, k, v, do, lse, delta, dk, dv, ds, R, N, STEPS, qk_scale,
                       BN: tl.constexpr, BM: tl.constexpr, DH: tl.constexpr, DS_OUT: tl.constexpr,
                       TILED: tl.constexpr):
    """Grid ``(N // BN, chunks, GROUPS)``: keys ``[BN]`` of group ``program_id(2)`` over the
    ``STEPS * BM`` rows of chunk ``program_id(1)``; ``dk``/``dv`` ``[chunks, GROUPS * N, DH]``."""
    i_n, i_c, i_g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_n = i_g * N + i_n * BN + tl.arange(0, BN)
    o_d = tl.arange(0, DH)
    b_k = tl.load(k + (o_n.to(tl.int64) * DH)[:, None] + o_d[None, :])
    b_v = tl.load(v + (o_n.to(tl.int64) * DH)[:, None] + o_d[None, :])
    b_dk = tl.zeros([BN, DH], dtype=tl.float32)
    b_dv = tl.zeros([BN, DH], dtype=tl.float32)
    r_lo = i_c * STEPS * BM  # the chunk's first row within its group
    for j in range(STEPS):
        o_r = r_lo + j * BM + tl.arange(0, BM)
        o_qr = (i_g * R + o_r).to(tl.int64)
        b_q = tl.load(q + (o_qr * DH)[:, None] + o_d[None, :])
        b_do = tl.load(do + (o_qr * DH)[:, None] + o_d[None, :])
        b_lse = tl.load(lse + o_qr)
        b_delta = tl.load(delta + o_qr)
        b_dk, b_dv, b_dst = attn_bwd_dkdv_ds_step(b_k, b_v, b_q, b_do, b_lse, b_delta, b_lse, b_dk, b_dv, None,
                                                  qk_scale, False, False, "tf32")
        if DS_OUT and TILED:
            tile = (o_n // 64).to(tl.int64) * (R // 64) + r_lo // 64 + j * (BM // 64)
            tl.store(ds + (tile * 4096 + (o_n % 64) * 64)[:, None] + (o_r % 64)[None, :], b_dst.to(tl.bfloat16))
        elif DS_OUT:
            tl.store(ds + (o_n.to(tl.int64) * R)[:, None] + o_r[None, :], b_dst.to(tl.bfloat16))
    o_out = (i_c * tl.num_programs(2) * N + o_n).to(tl.int64) * DH
    tl.store(dk + o_out[:, None] + o_d[None, :], b_dk)
    tl.store(dv + o_out[:, None] + o_d[None, :], b_dv)


@gluon.jit
def _copy_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, qdo_ready, qdo_empty,
                    R, N, STEPS, STAGES: gl.constexpr):
    """One warp: both warpgroups' keys and values, then each step's ``q`` and ``do`` into its slot once
    the slot's previous step is released (the barrier starts with that phase complete)."""
    BM: gl.constexpr = q_smem.shape[1]
    BOX: gl.constexpr = q_desc.block_type.shape[0]  # rows a copy: BM, or fewer in several copies
    BNW: gl.constexpr = k_desc.block_type.shape[0]
    key0 = gl.program_id(2) * N + gl.program_id(0) * (CONSUMERS * BNW)
    row0 = gl.program_id(2) * R + gl.program_id(1) * STEPS * BM
    mbarrier.expect(kv_bar, CONSUMERS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(k_desc, [key0 + c * BNW, 0], kv_bar, k_smem.index(c))
        tma.async_copy_global_to_shared(v_desc, [key0 + c * BNW, 0], kv_bar, v_smem.index(c))
    for j in range(STEPS):
        slot = j % STAGES
        mbarrier.wait(qdo_empty.index(slot), (j // STAGES) & 1)
        bar = qdo_ready.index(slot)
        mbarrier.expect(bar, (BM // BOX) * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
        for p in gl.static_range(BM // BOX):
            tma.async_copy_global_to_shared(q_desc, [row0 + j * BM + p * BOX, 0], bar,
                                            q_smem.index(slot).slice(p * BOX, BOX))
            tma.async_copy_global_to_shared(do_desc, [row0 + j * BM + p * BOX, 0], bar,
                                            do_smem.index(slot).slice(p * BOX, BOX))


@gluon.jit
def _compute_partition(ds_desc, ds, dk, dv, lse, delta, q_smem, do_smem, k_smem, v_smem, ds_smem, pt_smem, kv_bar,
                       qdo_ready, qdo_empty, R, N, STEPS, qk_scale, WG: gl.constexpr, STAGES: gl.constexpr,
                       DS_OUT: gl.constexpr, TILED: gl.constexpr):
    """One warpgroup's 64 keys over the chunk's rows; see the module's docstring for a step's order.
    ``DS_OUT``: 0 no ``dS^T``; 1 by TMA stores issued right after the next step's score products, 2
    the same after the step's wait; 3 stored from registers (``ds``), after the score products; 4 as 1
    without the proxy fence between the shared stores and the TMA store (a measurement only: the TMA
    store may read the buffer before the stores land); 5 as 1 but before the next step's score
    products are issued; 6 as 5 with the gradient products' A operands from shared memory (``P^T``
    from ``pt_smem``, ``dS^T`` from the buffer that its TMA store then sends), not registers: with
    them in registers ptxas serialises the kernel's wgmma for want of registers (note C7512)."""
    BM: gl.constexpr = q_smem.shape[1]
    DH: gl.constexpr = q_smem.shape[2]
    BNW: gl.constexpr = k_smem.shape[1]
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, DH, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    col_st: gl.constexpr = gl.SliceLayout(0, st_layout)
    i_n = gl.program_id(0)
    i_c = gl.program_id(1)
    i_g = gl.program_id(2)
    key0 = i_g * N + i_n * (CONSUMERS * BNW) + WG * BNW  # this warpgroup's first key (over all groups)
    r_lo = i_c * STEPS * BM  # the chunk's first row within its group
    row0 = i_g * R + r_lo
    k = k_smem.index(WG)
    v = v_smem.index(WG)
    o_c = gl.arange(0, BM, layout=col_st)
    # the warpgroup's dS^T rows for DS_OUT == 3
    o_nw = gl.arange(0, BNW, layout=gl.SliceLayout(1, st_layout))
    if TILED:  # BNW == BM == 64: step j's tile is the (j + r_lo // 64)-th after the warpgroup's first
        p_ds = ds + ((key0 // BNW).to(gl.int64) * (R // BM) + r_lo // BM) * (BNW * BM) + gl.expand_dims(o_nw * BM, 1)
    else:
        p_ds = ds + gl.expand_dims((key0 + o_nw).to(gl.int64) * R, 1)
    dk_acc = gl.zeros([BNW, DH], gl.float32, layout=acc_layout)
    dv_acc = gl.zeros([BNW, DH], gl.float32, layout=acc_layout)
    st_zero = gl.zeros([BNW, BM], gl.float32, layout=st_layout)

    mbarrier.wait(kv_bar, 0)
    mbarrier.wait(qdo_ready.index(0), 0)
    s_tok = warpgroup_mma(k, q_smem.index(0).permute((1, 0)), st_zero, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(v, do_smem.index(0).permute((1, 0)), st_zero, use_acc=False, is_async=True)
    lse_j = gl.load(lse + row0 + o_c)
    delta_j = gl.load(delta + row0 + o_c)
    st, dpt = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
    for j in range(STEPS - 1):
        slot = j % STAGES
        nxt = (j + 1) % STAGES
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse_j, 0))
        dst = (pt * (dpt - gl.expand_dims(delta_j, 0))).to(gl.bfloat16)
        dv_acc, dk_acc = _gradient_products(pt.to(gl.bfloat16), dst, do_smem.index(slot), q_smem.index(slot), dv_acc,
                                            dk_acc, ds_desc, ds_smem, pt_smem, key0, r_lo, j, R, a_layout, TILED,
                                            DS_OUT == 6)
        if DS_OUT == 5:
            _store_ds_tma(ds_desc, ds_smem, dst, key0, r_lo, j, R, TILED, True)
        mbarrier.wait(qdo_ready.index(nxt), ((j + 1) // STAGES) & 1)
        s_tok = warpgroup_mma(k, q_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v, do_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if DS_OUT == 1 or DS_OUT == 4:
            _store_ds_tma(ds_desc, ds_smem, dst, key0, r_lo, j, R, TILED, DS_OUT == 1)
        if DS_OUT == 3:
            gl.store(_ds_step(p_ds, r_lo, o_c, j, TILED), dst)
        lse_j = gl.load(lse + row0 + (j + 1) * BM + o_c)
        delta_j = gl.load(delta + row0 + (j + 1) * BM + o_c)
        st, dpt, dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(s_tok, dp_tok, dv_acc, dk_acc))
        mbarrier.arrive(qdo_empty.index(slot))
        if DS_OUT == 2:
            _store_ds_tma(ds_desc, ds_smem, dst, key0, r_lo, j, R, TILED, True)
    last = (STEPS - 1) % STAGES
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse_j, 0))
    dst = (pt * (dpt - gl.expand_dims(delta_j, 0))).to(gl.bfloat16)
    dv_acc, dk_acc = _gradient_products(pt.to(gl.bfloat16), dst, do_smem.index(last), q_smem.index(last), dv_acc,
                                        dk_acc, ds_desc, ds_smem, pt_smem, key0, r_lo, STEPS - 1, R, a_layout, TILED,
                                        DS_OUT == 6)
    if DS_OUT == 1 or DS_OUT == 2 or DS_OUT == 4 or DS_OUT == 5:
        _store_ds_tma(ds_desc, ds_smem, dst, key0, r_lo, STEPS - 1, R, TILED, True)
    if DS_OUT != 0 and DS_OUT != 3:
        tma.store_wait(0)
    if DS_OUT == 3:
        gl.store(_ds_step(p_ds, r_lo, o_c, STEPS - 1, TILED), dst)
    dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc))

    o_r = (i_c * gl.num_programs(2) * N + key0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, acc_layout))).to(gl.int64) * DH
    o_d = gl.arange(0, DH, layout=gl.SliceLayout(0, acc_layout))
    offs = gl.expand_dims(o_r, 1) + gl.expand_dims(o_d, 0)
    gl.store(dk + offs, dk_acc)
    gl.store(dv + offs, dv_acc)


@gluon.jit
def _ds_step(p_ds, r_lo, o_c, j, TILED: gl.constexpr):
    """Pointers to step ``j``'s ``dS^T`` tile from the warpgroup's rows ``p_ds``."""
    if TILED:
        return p_ds + j * 4096 + gl.expand_dims(o_c, 0)
    return p_ds + gl.expand_dims(r_lo + j * 64 + o_c, 0)


@gluon.jit
def _store_ds_tma(ds_desc, ds_smem, dst, key0, r_lo, j, R, TILED: gl.constexpr, FENCE: gl.constexpr):
    """``dst`` (step ``j``'s ``dS^T``) out by a TMA store from buffer ``j % 2``, once that buffer's
    store of two steps ago has been read out; with ``TILED`` the descriptor is over ``[tiles * 64, 64]``."""
    buf = ds_smem.index(j % 2)
    tma.store_wait(1)
    buf.store(dst)
    if FENCE:
        fence_async_shared()
    _tma_ds(ds_desc, buf, key0, r_lo, j, R, TILED)


@gluon.jit
def _tma_ds(ds_desc, buf, key0, r_lo, j, R, TILED: gl.constexpr):
    """The TMA store of step ``j``'s ``dS^T`` tile from ``buf`` (fenced by the caller)."""
    if TILED:
        tma.async_copy_shared_to_global(ds_desc, [((key0 // 64) * (R // 64) + r_lo // 64 + j) * 64, 0], buf)
    else:
        tma.async_copy_shared_to_global(ds_desc, [key0, r_lo + j * 64], buf)


@gluon.jit
def _gradient_products(pt, dst, do_tile, q_tile, dv_acc, dk_acc, ds_desc, ds_smem, pt_smem, key0, r_lo, j, R,
                       a_layout: gl.constexpr, TILED: gl.constexpr, SMEM_A: gl.constexpr):
    """Issue a step's ``dV += P^T dO`` and ``dK += dS^T Q``; with ``SMEM_A`` (``DS_OUT`` 6) their A
    operands come from shared memory: ``P^T`` from ``pt_smem``, ``dS^T`` from the step's ``dS``
    buffer, which its TMA store then sends (that buffer's store and product of two steps ago are
    done: the products were waited for, the store is waited for here)."""
    if SMEM_A:
        buf = ds_smem.index(j % 2)
        tma.store_wait(1)
        buf.store(dst)
        pt_smem.store(pt)
        fence_async_shared()
        dv_acc = warpgroup_mma(pt_smem, do_tile, dv_acc, is_async=True)
        dk_acc = warpgroup_mma(buf, q_tile, dk_acc, is_async=True)
        _tma_ds(ds_desc, buf, key0, r_lo, j, R, TILED)
    else:
        dv_acc = warpgroup_mma(gl.convert_layout(pt, a_layout), do_tile, dv_acc, is_async=True)
        dk_acc = warpgroup_mma(gl.convert_layout(dst, a_layout), q_tile, dk_acc, is_async=True)
    return dv_acc, dk_acc


@gluon.jit
def dkdv_gluon_kernel(q_desc, do_desc, k_desc, v_desc, ds_desc, ds, dk, dv, lse, delta, R, N, STEPS, qk_scale,
                      STAGES: gl.constexpr, DS_OUT: gl.constexpr, TILED: gl.constexpr, COMPUTE_REGS: gl.constexpr):
    """Grid ``(N // 128, chunks, GROUPS)``; ``num_warps`` 4 (the default partition is warpgroup 0)."""
    BM: gl.constexpr = ds_desc.block_type.shape[1]
    DH: gl.constexpr = q_desc.block_type.shape[1]
    BNW: gl.constexpr = k_desc.block_type.shape[0]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BM, DH], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BM, DH], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [CONSUMERS, BNW, DH], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [CONSUMERS, BNW, DH], v_desc.layout)
    ds0_smem = gl.allocate_shared_memory(ds_desc.dtype, [2, BNW, BM], ds_desc.layout)
    ds1_smem = gl.allocate_shared_memory(ds_desc.dtype, [2, BNW, BM], ds_desc.layout)
    # P^T's tiles for DS_OUT == 6 (a token 8-row stand-in otherwise, so that the other forms keep their room)
    PT_ROWS: gl.constexpr = BNW if DS_OUT == 6 else 8
    pt0_smem = gl.allocate_shared_memory(ds_desc.dtype, [PT_ROWS, BM], ds_desc.layout)
    pt1_smem = gl.allocate_shared_memory(ds_desc.dtype, [PT_ROWS, BM], ds_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qdo_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qdo_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(qdo_ready.index(i), count=1)
        mbarrier.init(qdo_empty.index(i), count=CONSUMERS)
    fence_async_shared()
    for i in gl.static_range(STAGES):  # every slot starts released
        mbarrier.arrive(qdo_empty.index(i), count=CONSUMERS)
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    gl.warp_specialize([
        (_compute_partition, (ds_desc, ds, dk, dv, lse, delta, q_smem, do_smem, k_smem, v_smem, ds0_smem, pt0_smem, kv_bar,
                              qdo_ready, qdo_empty, R, N, STEPS, qk_scale, WG0, STAGES, DS_OUT, TILED)),
        (_compute_partition, (ds_desc, ds, dk, dv, lse, delta, q_smem, do_smem, k_smem, v_smem, ds1_smem, pt1_smem, kv_bar,
                              qdo_ready, qdo_empty, R, N, STEPS, qk_scale, WG1, STAGES, DS_OUT, TILED)),
        (_copy_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, qdo_ready,
                           qdo_empty, R, N, STEPS, STAGES)),
    ], [4, 1], [COMPUTE_REGS, 24])


def _layouts(bm: int, bnw: int):
    """Shared layouts of the ``q``/``do`` step tiles, the key/value tiles and the ``dS^T`` tiles."""
    return (gl.NVMMASharedLayout.get_default_for([bm, D], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([bnw, D], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([bnw, bm], gl.bfloat16))


def make_inputs(n: int, rows: int, gen: torch.Generator):
    """Random bf16 ``q, k, v, do`` and the rows' true log2-domain ``lse`` over the ``n`` keys of their
    group (so every ``P`` is a probability), and a ``delta`` of the size real ones have."""
    q, do = (torch.randn(GROUPS * rows, D, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(GROUPS * n, D, device="cuda", generator=gen).bfloat16() for _ in range(2))
    qk_scale = D ** -0.5 * LOG2E
    lse = torch.empty(GROUPS * rows, device="cuda")
    for g in range(GROUPS):  # in row chunks: the score matrix of a whole group need not fit
        for r0 in range(0, rows, 16384):
            rq = q[g * rows + r0:g * rows + min(rows, r0 + 16384)].float()
            lse[g * rows + r0:g * rows + r0 + len(rq)] = torch.logsumexp(
                rq @ k[g * n:(g + 1) * n].float().T * (qk_scale / LOG2E), dim=1) * LOG2E
    delta = 0.1 * torch.randn(GROUPS * rows, device="cuda", generator=gen)
    return q, k, v, do, lse, delta, qk_scale


def reference(q, k, v, do, lse, delta, n: int, rows: int, qk_scale: float):
    """float32 ``(dK, dV, dS^T)``, ``P^T`` and ``dS^T`` rounded to bf16 before their products as the
    kernels do."""
    dk, dv, dst_all = [], [], []
    for g in range(GROUPS):
        rq, rdo = q[g * rows:(g + 1) * rows].float(), do[g * rows:(g + 1) * rows].float()
        rk, rv = k[g * n:(g + 1) * n].float(), v[g * n:(g + 1) * n].float()
        pt = torch.exp2(rk @ rq.T * qk_scale - lse[g * rows:(g + 1) * rows][None, :])
        dst = pt * (rv @ rdo.T - delta[g * rows:(g + 1) * rows][None, :])
        dv.append(pt.bfloat16().float() @ rdo)
        dk.append(dst.bfloat16().float() @ rq)
        dst_all.append(dst)
    return torch.cat(dk), torch.cat(dv), torch.cat(dst_all)


def run(kind: str, ins, n: int, rows: int, chunks: int, stages: int, ds_out: int, tiled: bool, regs: int = 240,
        copies: int = 1):
    """``(outputs (dk, dv, ds), call)`` for one configuration; outputs NaN-poisoned."""
    q, k, v, do, lse, delta, qk_scale = ins
    bm, bn = 64, 128
    steps = rows // (chunks * bm)
    assert steps * chunks * bm == rows and n % bn == 0, "rows must split into whole 64-row steps, keys into 128s"
    dk = torch.full((chunks, GROUPS * n, D), float("nan"), device="cuda")
    dv = torch.full_like(dk, float("nan"))
    ds = torch.full((GROUPS * n * rows // 64, 64) if tiled else (GROUPS * n, rows), float("nan"), device="cuda",
                    dtype=torch.bfloat16)
    grid = (n // bn, chunks, GROUPS)
    if kind == "triton":
        def call():
            dkdv_triton_kernel[grid](q, k, v, do, lse, delta, dk, dv, ds, rows, n, steps, qk_scale, BN=bn, BM=bm, DH=D,
                                     DS_OUT=ds_out, TILED=tiled, num_warps=8, num_stages=stages)
    else:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        row_layout, key_layout, ds_layout = _layouts(bm, bn // 2)
        q_d, do_d = (TensorDescriptor(t, list(t.shape), list(t.stride()), [bm // copies, D], row_layout)
                     for t in (q, do))
        k_d, v_d = (TensorDescriptor(t, list(t.shape), list(t.stride()), [bn // 2, D], key_layout) for t in (k, v))
        ds_d = TensorDescriptor(ds, list(ds.shape), list(ds.stride()), [64, 64], ds_layout)

        def call():
            dkdv_gluon_kernel[grid](q_d, do_d, k_d, v_d, ds_d, ds, dk, dv, lse, delta, rows, n, steps, qk_scale,
                                    STAGES=stages, DS_OUT=ds_out, TILED=tiled, COMPUTE_REGS=regs, num_warps=4, maxnreg=168)
    return (dk, dv, ds), call


#: (kind, stages, dS stored (the Gluon kernel's DS_OUT), dS in tiles, the Gluon computing warpgroups'
#: registers)
CONFIGS = [("triton", 3, 1, False, 0), ("triton", 3, 0, False, 0)]
CONFIGS += [("gluon", stages, ds_out, False, 240) for stages, ds_out in itertools.product((2, 3, 4), (0, 1, 2, 3))]
CONFIGS += [("triton", 3, 1, True, 0)]
CONFIGS += [("gluon", stages, ds_out, True, 240) for stages, ds_out in itertools.product((2, 4), (1, 2, 3))]
CONFIGS += [("gluon", stages, ds_out, False, 240) for stages, ds_out in itertools.product((2, 4), (4, 5))]
#: with each step's q and do rows in 4 copies of 16 (the library's copies at 16 heads a KV group)
CONFIGS += [("gluon", 4, 5, False, 240, 4), ("gluon", 4, 0, False, 240, 4)]
#: the gradient products' A operands from shared memory (no C7512), 2 or 3 slots, 1 or 4 copies
CONFIGS += [("gluon", stages, 6, False, 240, copies) for stages, copies in itertools.product((2, 3), (1, 4))]


def compile_only() -> None:
    """The Gluon configurations compiled for sm_90 (no GPU): registers, spills, shared memory, notes."""
    row_layout, key_layout, ds_layout = _layouts(64, 64)
    for kind, stages, ds_out, tiled, regs, *rest in CONFIGS:
        box = 64 // (rest[0] if rest else 1)
        if kind != "gluon":
            continue
        values = dict(STAGES=stages, DS_OUT=ds_out, TILED=tiled, COMPUTE_REGS=regs)
        sig = {"q_desc": descriptor([box, D], row_layout), "do_desc": descriptor([box, D], row_layout),
               "k_desc": descriptor([64, D], key_layout), "v_desc": descriptor([64, D], key_layout),
               "ds_desc": descriptor([64, 64], ds_layout), "ds": "*bf16", "dk": "*fp32", "dv": "*fp32", "lse": "*fp32",
               "delta": "*fp32", "R": "i32", "N": "i32", "STEPS": "i32", "qk_scale": "fp32",
               **{key: "constexpr" for key in values}}
        compile_report(dkdv_gluon_kernel, sig, values, f"gluon stages={stages} ds_out={ds_out} tiled={tiled} "
                       f"regs={regs} rows a copy {box}", num_warps=4, maxnreg=168)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=4096, help="keys per group (multiple of 128)")
    ap.add_argument("--rows", type=int, default=262144, help="rows per group (chunks * 64 divides it)")
    ap.add_argument("--chunks", type=int, default=8, help="row chunks (programs per key tile)")
    args = parse_run_arguments(ap, "CONFIGS (default all)", compile_only)
    if args is None:
        return
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{GROUPS} groups x {args.keys} keys x {args.rows} rows in {args.chunks} chunks, head dim {D}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(61)
    small_n, small_rows, small_chunks = 256, 1024, 2
    small = make_inputs(small_n, small_rows, gen)
    want = reference(*small[:6], small_n, small_rows, small[6])
    big = make_inputs(args.keys, args.rows, gen)
    flops = 8.0 * GROUPS * args.keys * args.rows * D
    for kind, stages, ds_out, tiled, regs, *rest in (CONFIGS[i] for i in (args.configs or range(len(CONFIGS)))):
        copies = rest[0] if rest else 1
        name = f"{kind:6s} stages={stages} ds_out={ds_out} tiled={tiled!s:5}" + (f" copies={copies}" if rest else "") + (f" regs={regs}" if kind == "gluon" else "")
        try:
            (dk, dv, ds), call = run(kind, small, small_n, small_rows, small_chunks, stages, ds_out, tiled, regs,
                                     copies)
            call()
            errs = [((got - ref).abs().max() / ref.abs().max()).item()
                    for got, ref in ((dk.sum(0), want[0]), (dv.sum(0), want[1]))]
            want_ds = want[2]
            if tiled:  # [keys, rows] -> [key tiles, row tiles, 64, 64]
                want_ds = want_ds.view(-1, 64, small_rows // 64, 64).permute(0, 2, 1, 3).reshape(ds.shape)
            errs.append(((ds.float() - want_ds).abs().max() / want_ds.abs().max()).item() if ds_out else 0.0)
            _, call = run(kind, big, args.keys, args.rows, args.chunks, stages, ds_out, tiled, regs, copies)
            ms = triton.testing.do_bench(call, warmup=10, rep=300, return_mode="median")
            print(f"{name}: {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  relative error dK {errs[0]:.1e} "
                  f"dV {errs[1]:.1e} dS {errs[2]:.1e}", flush=True)
        except Exception as exc:  # a configuration that does not compile or fit is reported, not fatal
            print(f"{name}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)


if __name__ == "__main__":
    main()
