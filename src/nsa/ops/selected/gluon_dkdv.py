"""The selected branch's dK/dV on Hopper, warp-specialised (Gluon): ``selected_bwd_dkdv_kernel``
(:mod:`nsa.ops.selected.backward`) with ``DS_OUT`` and without the causal mask, in another form.

Why: after the compressed branch's, this is the longest kernel of the 64k forward+backward on the H200
(12.2 of 93 ms in session 62), and it runs at about 330 TFLOP/s of useful work where the compressed
branch's Gluon dK/dV reaches 1.2x its Triton kernel. Its Triton loop gathers each step's ``q`` and
``do`` rows with pointer loads and issues each product and waits for it.

A program is the Triton kernel's: one segment of at most ``QSEG`` queries of a (batch, KV head,
block) owner's list, the same grid and order. One warp copies, into a ring of slots: the block's
keys and values once, then each step's ``BQ`` queries' ``q`` and ``do`` rows by TMA (one copy a
query: its ``G`` heads are contiguous) and their row vectors (lse, delta, gate) by plain loads,
issued before it waits for the slot. One warpgroup computes: it issues a step's gradient products
(``dV += P^T dO``, ``dK += dS^T Q``), stores its ``dS``, issues the next step's score products
(``S^T = K Q^T``, ``dP^T = V dO^T``) and reads where that step's ``dS`` goes while they run, then
waits for all four. One program an SM, with 4 ring slots and 256 registers for the warpgroup.

It applies where the Triton kernel runs without its causal mask: the NSA prefill, whose window
branch takes each query's local blocks (``skip_local``), so that every listed block ends before its
query. A step's padding rows (past the segment's end) copy the last real query's rows and get an
lse of +inf: their ``P`` and ``dS`` are 0, and their ``dS`` is not stored. ``dK``/``dV`` and ``dS``
go where the Triton kernel puts them; :func:`selected_bwd_reduce_kernel` sums the partials as before.

Measured (session 63, H200, Triton 3.6; ``scripts/gpu_session63.sh selected``, ``prefetch``, ``ring``):
the same dk, dv and ``dS`` as the Triton kernel's within bf16 rounding (7 GPU tests). At 64k the kernel
takes 9.95-9.97 ms against the Triton kernel's 12.43-12.50 (1.25x); 1.13-1.14 ms against 1.48-1.49 at
8k. Two programs an SM (2 slots, 232 registers, wgmma serialised by ptxas for want of them: C7512)
took 10.86-10.94 ms, 3 slots at one an SM 10.09-10.16; the copy warp's loads run two steps ahead,
11.11 (more spills: the copy warp is not what holds it). Compiles for sm_90 with Triton 3.6-3.9 (170
KiB of shared memory, 24 bytes spilled with Triton 3.6, no C7512).

Gluon has no CPU interpreter: the kernel runs on Hopper GPUs only, where the GPU tests compare it with
the Triton kernel (``tests/ops/test_gluon_selected_dkdv.py``); the CPU tests compile it for sm_90 with
the installed Triton (:func:`compile_for_hopper`). :func:`fits` says where it applies.
"""

from __future__ import annotations

import torch

from nsa import flags
from nsa.ops._gluon import (a_operand_layout, compile_for_sm90, copies_fit, descriptor_signature, gl, gluon,
                            launch_descriptors, launch_failed, mbarrier, on_hopper, ring_barriers, tma_load,
                            warpgroup_mma, warpgroup_mma_wait, wgmma_layout)

#: Query rows a step ((query, head) pairs of one KV group: ``64 // G`` queries), as the Triton kernel's.
ROWS = 64
#: Keys a block: the paper's selection block, the wgmma's M of one warpgroup.
BLOCK = 64
#: Slots of the ``q``/``do`` ring (session 63, 64k: 4 slots 9.95-9.97 ms, 3 slots 10.09-10.16).
STAGES = 4
#: Launch options: a warpgroup computes (256 registers), a warp copies (24); one program an SM. Two
#: an SM (at 128, the warpgroup 232) serialised the wgmma and took 10.86-10.94 ms (session 63).
LAUNCH_OPTIONS = dict(num_warps=4, maxnreg=168)


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, sel_block: int, bq: int,
         has_ds: bool, causal: bool) -> bool:
    """Whether this kernel replaces the Triton dK/dV: ``NSA_GLUON_SELECTED_DKDV`` on, ``dS`` stored
    for the dQ, no causal mask (each query's own block left to the window), a Hopper GPU with Gluon,
    and inputs and tiles it takes (:func:`shapes_fit`)."""
    return (flags.get("NSA_GLUON_SELECTED_DKDV") and has_ds and not causal and on_hopper(q)
            and shapes_fit(q, k, v, do, sel_block, bq))


def shapes_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, sel_block: int, bq: int) -> bool:
    """Contiguous 16-bit inputs with 128-wide heads (the TMA copies take them as row matrices), 8-64
    heads a KV head in steps of 64 rows (``bq``, the Triton kernel's queries a step, times ``G``),
    blocks of 64 keys and whole blocks of keys (a block's copy would read the next sequence's keys)."""
    G = copies_fit(q, k, v, do)
    return G > 0 and bq * G == ROWS and sel_block == BLOCK and k.shape[1] % BLOCK == 0


if gluon is not None:

    @gluon.jit
    def _segment(seg_owner, starts, counts, seg_first, NBHJ, QSEG: gl.constexpr, BQ: gl.constexpr):
        """``(owner, live, e_lo, e_hi, steps)`` of this program's segment: entries ``[e_lo, e_hi)`` of
        ``t_sorted``, ``BQ`` a step; a program past the last segment is not live (owner clamped)."""
        i_p = gl.program_id(0)
        i_o = gl.load(seg_owner + i_p)
        live = i_o < NBHJ
        i_o = gl.minimum(i_o, NBHJ - 1)
        i_start = gl.load(starts + i_o)
        e_lo = i_start + (i_p - gl.load(seg_first + i_o)) * QSEG
        e_hi = gl.minimum(e_lo + QSEG, i_start + gl.load(counts + i_o))
        return i_o, live, e_lo, e_hi, gl.cdiv(e_hi - e_lo, BQ)

    @gluon.jit
    def _copy_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                        qdo_ready, qdo_empty, lse, delta, gate, t_sorted, seg_owner, starts, counts, seg_first,
                        T, TK, NB, NBHJ, H: gl.constexpr, G: gl.constexpr, BQ: gl.constexpr, QSEG: gl.constexpr,
                        GATED: gl.constexpr, STAGES: gl.constexpr):
        """One warp: the block's keys and values, then each step's rows into the step's slot once the
        warpgroup has released it (every slot starts released): ``q`` and ``do`` by one copy a query,
        and the row vectors (lse, delta, gate) into the slot's ``rows_smem``, loaded before the wait
        for the slot so that their latency overlaps it."""
        BS: gl.constexpr = k_desc.block_type.shape[0]
        DH: gl.constexpr = k_desc.block_type.shape[1]
        M: gl.constexpr = BQ * G
        i_o, live, e_lo, e_hi, steps = _segment(seg_owner, starts, counts, seg_first, NBHJ, QSEG, BQ)
        if live:
            i_b = i_o // (H * NB)
            i_h = (i_o // NB) % H
            key0 = i_b * TK + (i_o % NB) * BS
            mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma_load(k_desc, [key0, i_h * DH], kv_bar, k_smem)
            tma_load(v_desc, [key0, i_h * DH], kv_bar, v_smem)
            o_m = gl.arange(0, M, layout=gl.BlockedLayout([M // 32], [32], [1], [0]))
            for j in range(steps):
                slot = j % STAGES
                e0 = e_lo + j * BQ
                e_m = e0 + o_m // G
                m_m = e_m < e_hi
                t_m = gl.load(t_sorted + e_m, mask=m_m, other=0)
                o_row = (i_b.to(gl.int64) * T + t_m) * (H * G) + i_h * G + o_m % G
                # padding rows: lse +inf makes their P, and so their dS, 0
                b_lse = gl.load(lse + o_row, mask=m_m, other=float("inf"))
                b_delta = gl.load(delta + o_row, mask=m_m, other=0.0)
                if GATED:
                    b_gate = gl.load(gate + o_row, mask=m_m, other=0.0)
                mbarrier.wait(qdo_empty.index(slot), (j // STAGES) & 1)
                bar = qdo_ready.index(slot)
                mbarrier.expect(bar, BQ * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
                for p in gl.static_range(BQ):
                    t = gl.load(t_sorted + gl.minimum(e0 + p, e_hi - 1))  # padding: the last real query's rows
                    row = ((i_b * T + t) * H + i_h) * G
                    tma_load(q_desc, [row, 0], bar, q_smem.index(slot).slice(p * G, G))
                    tma_load(do_desc, [row, 0], bar, do_smem.index(slot).slice(p * G, G))
                rows_smem.index(4 * slot).store(b_lse)
                rows_smem.index(4 * slot + 1).store(b_delta)
                if GATED:
                    rows_smem.index(4 * slot + 2).store(b_gate)
                mbarrier.arrive(bar)  # the barrier's second arrival: whoever waits on it sees the rows

    @gluon.jit
    def _gradients(st, dpt, rows_smem, slot, qk_scale, GATED: gl.constexpr, dtype: gl.constexpr):
        """A step's ``P^T`` (gated) and ``dS^T``, in ``dtype``, from its scores ``st`` and ``dpt`` and
        the rows' lse (log2 domain), delta and gate in slot ``slot`` of ``rows_smem``."""
        row_layout: gl.constexpr = gl.SliceLayout(0, st.type.layout)
        pt = gl.exp2(st * qk_scale - gl.expand_dims(rows_smem.index(4 * slot).load(row_layout), 0))
        if GATED:
            pt = pt * gl.expand_dims(rows_smem.index(4 * slot + 2).load(row_layout), 0)
        dst = pt * (dpt - gl.expand_dims(rows_smem.index(4 * slot + 1).load(row_layout), 0))
        return pt.to(dtype), dst.to(dtype)

    @gluon.jit
    def _ds_rows(t_sorted, n_sorted, i_b, i_h, e0, e_hi, o_m, T, H: gl.constexpr, G: gl.constexpr,
                 N: gl.constexpr):
        """Rows of ``ds [B * T * H * N * G, BS]`` for a step's rows ``o_m`` (entries from ``e0``, ``G``
        rows each), -1 for padding rows."""
        e_m = e0 + o_m // G
        m_m = e_m < e_hi
        t_m = gl.load(t_sorted + e_m, mask=m_m, other=0)
        n_m = gl.load(n_sorted + e_m, mask=m_m, other=0)
        rows = (((i_b.to(gl.int64) * T + t_m) * H + i_h) * N + n_m) * G + o_m % G
        return gl.where(m_m, rows, -1)

    @gluon.jit
    def _store_ds(ds, dst, ds_rows, ds_layout: gl.constexpr):
        """A step's ``dS^T [BS, rows]`` into ``ds`` (row-major ``[G, BS]`` a pair): 8 keys (16 bytes) a
        store, padding rows (``ds_rows`` -1) left out."""
        BS: gl.constexpr = dst.shape[0]
        b_ds = gl.convert_layout(dst, ds_layout)
        o_c = gl.arange(0, BS, layout=gl.SliceLayout(1, ds_layout))
        rows = gl.expand_dims(ds_rows, 0)
        gl.store(ds + rows * BS + gl.expand_dims(o_c, 1), b_ds, mask=(rows >= 0) & gl.expand_dims(o_c < BS, 1))

    @gluon.jit
    def _compute_partition(dk, dv, dk_part, dv_part, ds, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                           qdo_ready, qdo_empty, t_sorted, n_sorted, seg_owner, starts, counts, seg_first, seg_count,
                           T, TK, NB, NBHJ, qk_scale, scale, H: gl.constexpr, G: gl.constexpr, N: gl.constexpr,
                           BQ: gl.constexpr, QSEG: gl.constexpr, GATED: gl.constexpr, STAGES: gl.constexpr):
        """The warpgroup: the block's 64 keys over the segment's steps (the module's docstring gives a
        step's order); then its ``dK`` (times ``scale``) and ``dV``, or their float32 partials where
        the owner has several segments."""
        M: gl.constexpr = BQ * G
        DH: gl.constexpr = q_smem.shape[2]
        BS: gl.constexpr = k_smem.shape[0]
        st_layout: gl.constexpr = wgmma_layout(M)
        acc_layout: gl.constexpr = wgmma_layout(DH)
        a_layout: gl.constexpr = a_operand_layout(acc_layout)
        # the dS stores: 8 neighbouring keys a thread, a row's 64 keys by 8 threads
        ds_layout: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
        i_o, live, e_lo, e_hi, steps = _segment(seg_owner, starts, counts, seg_first, NBHJ, QSEG, BQ)
        if live:
            i_b = i_o // (H * NB)
            i_h = (i_o // NB) % H
            o_m = gl.arange(0, M, layout=gl.SliceLayout(0, ds_layout))
            dk_acc = gl.zeros([BS, DH], gl.float32, layout=acc_layout)
            dv_acc = gl.zeros([BS, DH], gl.float32, layout=acc_layout)
            st_zero = gl.zeros([BS, M], gl.float32, layout=st_layout)
            mbarrier.wait(kv_bar, 0)
            mbarrier.wait(qdo_ready.index(0), 0)
            s_tok = warpgroup_mma(k_smem, q_smem.index(0).permute((1, 0)), st_zero, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(v_smem, do_smem.index(0).permute((1, 0)), st_zero, use_acc=False, is_async=True)
            ds_rows = _ds_rows(t_sorted, n_sorted, i_b, i_h, e_lo, e_hi, o_m, T, H, G, N)
            st, dpt = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
            for j in range(steps - 1):
                slot = j % STAGES
                nxt = (j + 1) % STAGES
                pt, dst = _gradients(st, dpt, rows_smem, slot, qk_scale, GATED, q_smem.dtype)
                dv_acc = warpgroup_mma(gl.convert_layout(pt, a_layout), do_smem.index(slot), dv_acc, is_async=True)
                dk_acc = warpgroup_mma(gl.convert_layout(dst, a_layout), q_smem.index(slot), dk_acc, is_async=True)
                _store_ds(ds, dst, ds_rows, ds_layout)
                mbarrier.wait(qdo_ready.index(nxt), ((j + 1) // STAGES) & 1)
                s_tok = warpgroup_mma(k_smem, q_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False,
                                      is_async=True)
                dp_tok = warpgroup_mma(v_smem, do_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False,
                                       is_async=True)
                ds_rows = _ds_rows(t_sorted, n_sorted, i_b, i_h, e_lo + (j + 1) * BQ, e_hi, o_m, T, H, G, N)
                st, dpt, dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(s_tok, dp_tok, dv_acc, dk_acc))
                mbarrier.arrive(qdo_empty.index(slot))
            last = (steps - 1) % STAGES
            pt, dst = _gradients(st, dpt, rows_smem, last, qk_scale, GATED, q_smem.dtype)
            dv_acc = warpgroup_mma(gl.convert_layout(pt, a_layout), do_smem.index(last), dv_acc, is_async=True)
            dk_acc = warpgroup_mma(gl.convert_layout(dst, a_layout), q_smem.index(last), dk_acc, is_async=True)
            _store_ds(ds, dst, ds_rows, ds_layout)
            dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc))

            o_c = gl.arange(0, BS, layout=gl.SliceLayout(1, acc_layout))
            o_d = gl.expand_dims(gl.arange(0, DH, layout=gl.SliceLayout(0, acc_layout)), 0)
            if gl.load(seg_count + i_o) == 1:  # the owner's one segment: dk, dv [B, TK, H, DH]
                o_s = (i_o % NB) * BS + o_c
                offs = gl.expand_dims(((i_b.to(gl.int64) * TK + o_s) * H + i_h) * DH, 1) + o_d
                m_s = gl.expand_dims(o_s < TK, 1) & (o_d < DH)
                gl.store(dk + offs, (dk_acc * scale).to(dk.dtype.element_ty), mask=m_s)
                gl.store(dv + offs, dv_acc.to(dv.dtype.element_ty), mask=m_s)
            else:  # partials [S, BS, DH] for the reduction, which sums them in order
                offs = gl.program_id(0).to(gl.int64) * BS * DH + gl.expand_dims(o_c * DH, 1) + o_d
                gl.store(dk_part + offs, dk_acc)
                gl.store(dv_part + offs, dv_acc)

    @gluon.jit
    def selected_bwd_dkdv_gluon_kernel(
        q_desc, do_desc, k_desc, v_desc,  # q/do [B*T*HQ, D] (G rows a copy), k/v [B*TK, H*D] (a block a copy)
        dk, dv, dk_part, dv_part, ds, lse, delta, gate,
        t_sorted, n_sorted, starts, counts, seg_first, seg_count, seg_owner,
        T, TK, NB, NBHJ, qk_scale, scale,
        H: gl.constexpr, G: gl.constexpr, N: gl.constexpr, BQ: gl.constexpr, QSEG: gl.constexpr,
        GATED: gl.constexpr, STAGES: gl.constexpr,
    ):
        """Grid ``(S,)``, one program a segment (the Triton kernel's), ``num_warps=4`` (the default
        partition computes), the copy warp a worker."""
        DH: gl.constexpr = q_desc.block_type.shape[1]
        BS: gl.constexpr = k_desc.block_type.shape[0]
        M: gl.constexpr = BQ * G
        # the descriptors copy G rows at a time into [M, DH] slots of the same swizzled layout
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, M, DH], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, M, DH], do_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [BS, DH], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [BS, DH], v_desc.layout)
        # slot s's row vectors in rows 4 s (lse), 4 s + 1 (delta), 4 s + 2 (gate): shapes are powers of two
        gl.static_assert(STAGES == 2 or STAGES == 4)
        rows_smem = gl.allocate_shared_memory(gl.float32, [4 * STAGES, M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        kv_bar, qdo_ready, qdo_empty = ring_barriers(STAGES, 1)  # the consumers: the warpgroup
        gl.warp_specialize([
            (_compute_partition, (dk, dv, dk_part, dv_part, ds, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                                  qdo_ready, qdo_empty, t_sorted, n_sorted, seg_owner, starts, counts, seg_first,
                                  seg_count, T, TK, NB, NBHJ, qk_scale, scale, H, G, N, BQ, QSEG, GATED, STAGES)),
            (_copy_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                               qdo_ready, qdo_empty, lse, delta, gate, t_sorted, seg_owner, starts, counts, seg_first,
                               T, TK, NB, NBHJ, H, G, BQ, QSEG, GATED, STAGES)),
        ], [1], [24])  # the copy warp: 24 registers


def selected_bwd_dkdv_gluon(q, k, v, do, gate, lse, delta, dk, dv, dk_part, dv_part, ds, inv: dict, qseg: int,
                            qk_scale: float, scale: float) -> None:
    """Launch the kernel over the Triton kernel's grid (``inv``: :func:`invert_selection`'s lists with
    ``n_sorted``; one program a ``seg_owner`` entry): ``dk``/``dv`` where an owner has one segment,
    else the float32 ``dk_part``/``dv_part [S, 64, D]``; ``ds [B, T, H, N, G, 64]``. ``gate`` None or
    float32 ``[B, T, HQ]``. A Triton whose Gluon cannot build it raises naming the flag that turns it
    off."""
    B, T, HQ, _ = q.shape
    TK, H = k.shape[1], k.shape[2]
    G = HQ // H
    q_desc, do_desc, k_desc, v_desc = launch_descriptors((q, do), (k, v), BLOCK)
    n_prog, num_blocks = inv["seg_owner"].numel(), TK // BLOCK
    try:
        selected_bwd_dkdv_gluon_kernel[(n_prog,)](
            q_desc, do_desc, k_desc, v_desc, dk, dv, dk_part, dv_part, ds, lse, delta, lse if gate is None else gate,
            inv["t_sorted"], inv["n_sorted"], inv["starts"], inv["counts"], inv["seg_first"], inv["seg_count"],
            inv["seg_owner"], T, TK, num_blocks, B * H * num_blocks, qk_scale, scale,
            H=H, G=G, N=ds.shape[3], BQ=ROWS // G, QSEG=qseg, GATED=gate is not None, STAGES=STAGES, **LAUNCH_OPTIONS)
    except Exception as exc:  # Gluon is experimental: its API moves between Triton releases
        raise launch_failed("the selected dK/dV", "NSA_GLUON_SELECTED_DKDV", exc) from exc


def compile_for_hopper(G: int = 16, gated: bool = True, dtype: torch.dtype = torch.bfloat16, qseg: int = 1024):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU: what
    :func:`selected_bwd_dkdv_gluon` would launch for ``G`` query heads a KV head (head dim 128) and the
    paper's 16 selected blocks. Returns Triton's compiled kernel (``asm``, ``metadata``)."""
    D = 128
    values = dict(H=4, G=G, N=16, BQ=ROWS // G, QSEG=qseg, GATED=gated, STAGES=STAGES)
    el = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    signature = {**descriptor_signature(dtype, G, BLOCK, ("q_desc", "do_desc"), ("k_desc", "v_desc"), D),
                 "dk": el, "dv": el, "dk_part": "*fp32", "dv_part": "*fp32", "ds": el,
                 "lse": "*fp32", "delta": "*fp32", "gate": "*fp32",
                 **{name: "*i32" for name in ("t_sorted", "n_sorted", "starts", "counts", "seg_first", "seg_count",
                                              "seg_owner")},
                 "T": "i32", "TK": "i32", "NB": "i32", "NBHJ": "i32", "qk_scale": "fp32", "scale": "fp32",
                 **{name: "constexpr" for name in values}}
    return compile_for_sm90(selected_bwd_dkdv_gluon_kernel, signature, values, LAUNCH_OPTIONS)
