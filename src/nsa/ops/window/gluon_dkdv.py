"""The window branch's dK/dV on Hopper, warp-specialised (Gluon): ``window_bwd_dkdv_kernel``
(:mod:`nsa.ops.window.backward`) at its Hopper tiles, in the form of the compressed branch's Gluon
dK/dV (:mod:`nsa.ops.compressed.gluon_dkdv`).

Why: at 64k the Triton kernel takes 9.4 ms of the forward+backward's 90.5 (H200, session 63), about
260 TFLOP/s of the band's work: a key tile's band is short (its 128 keys see 638 query positions) and
each program's loads, stores and masks weigh on it.

A program is the Triton kernel's: a tile of 128 keys of one (batch, KV head), walking the query tiles
of its band (``BT`` positions of ``G`` heads, 64 rows) in the same order, phased or not. One warp
copies, into a ring of slots: the tile's keys and values once, then each step's ``q`` and ``do``
rows by TMA (one copy a position: its ``G`` heads are contiguous) and the rows' lse, delta and gate
(and the selected branch's, with ``FORCED``) by plain loads. Two warpgroups compute, 64 keys each,
from the same slots: each issues a step's gradient products (``dV += P^T dO``, ``dK += dS^T Q``),
then the next step's score products (``S^T = K Q^T``, ``dP^T = V dO^T``), and waits for all four.
Every step is masked by the band; on the steps whose queries hold one of the tile's blocks as a local
block of the selected branch (``FORCED``), that branch's share is added as the Triton kernel adds it.
Rows past the last query get an lse of +inf, which makes their ``P`` and ``dS`` 0.

Gluon has no CPU interpreter: the kernel runs on Hopper GPUs only, where the GPU tests compare it with
the Triton kernel (``tests/ops/test_gluon_window_dkdv.py``); the CPU tests compile it for sm_90 with
the installed Triton (:func:`compile_for_hopper`). :func:`fits` says where it applies.
"""

from __future__ import annotations

import torch

from nsa import flags
from nsa.ops._gluon import PAIR_LAUNCH as LAUNCH_OPTIONS  # two computing warpgroups, a copy warp
from nsa.ops._gluon import (a_operand_layout, compile_for_sm90, copies_fit, descriptor_signature, gl, gluon,
                            launch_descriptors, launch_failed, mbarrier, on_hopper, ring_barriers, store_scaled,
                            tma_load, warpgroup_mma, warpgroup_mma_wait, wgmma_layout)

#: Keys a computing warpgroup owns (two a program: the Triton kernel's Hopper tile of 128).
KEYS_PER_WARPGROUP = 64
#: Query rows a step ((position, head) pairs of one KV group), as the Triton kernel's tiles.
ROWS = 64
#: Slots of the ``q``/``do`` ring.
STAGES = 4


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, cfg: dict) -> bool:
    """Whether this kernel replaces the Triton dK/dV: ``NSA_GLUON_WINDOW_DKDV`` on, a Hopper GPU with
    Gluon, and inputs and tiles it takes (:func:`shapes_fit`)."""
    return flags.get("NSA_GLUON_WINDOW_DKDV") and on_hopper(q) and shapes_fit(q, k, v, do, cfg)


def shapes_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, cfg: dict) -> bool:
    """Contiguous 16-bit inputs with 128-wide heads (the TMA copies take them as row matrices), and the
    Triton kernel's Hopper tiles: 64 rows of 8-64 heads (``cfg``'s ``GP``, ``BT``), 128 keys (``BN``)."""
    G = copies_fit(q, k, v, do)
    return G > 0 and cfg["GP"] == G and cfg["BT"] * G == ROWS and cfg["BN"] == 2 * KEYS_PER_WARPGROUP


if gluon is not None:

    @gluon.jit
    def _band(T, q_offset, W, BT: gl.constexpr, BN: gl.constexpr, BS: gl.constexpr, LOCAL: gl.constexpr,
              FORCED: gl.constexpr, PHASED: gl.constexpr):
        """``(steps, n_tail, i_first, i_split, i_local)`` of key tile ``program_id(0)``'s band: the
        Triton kernel's arithmetic (Gluon cannot call Triton functions; the GPU tests keep the two in
        step). Query tiles ``[i_split, i_end)`` come first (``n_tail`` of them), then ``[i_first,
        i_split)``; rows before ``i_local`` also hold one of the tile's blocks as a local one."""
        i_n = gl.program_id(0)
        s0 = i_n * BN
        i_first = gl.maximum(s0 - q_offset, 0) // BT * BT
        i_end = gl.minimum(s0 + BN - 1 + W - 1 - q_offset, T - 1) + 1
        i_local = i_first
        if FORCED:
            i_local = gl.minimum(((s0 + BN - 1) // BS + LOCAL) * BS - q_offset, i_end)
            i_local = gl.maximum(gl.cdiv(i_local, BT) * BT, i_first)
        i_split = i_first
        if PHASED:
            runs = (BN + W - 2) // BN + 1
            lead = (runs - i_n % runs) % runs
            i_split = gl.minimum(gl.maximum((s0 + lead * BN - q_offset) // BT * BT, i_first), i_end)
        steps = gl.maximum(gl.cdiv(i_end - i_first, BT), 0)
        n_tail = gl.maximum(gl.cdiv(i_end - i_split, BT), 0)
        return steps, n_tail, i_first, i_split, i_local

    @gluon.jit
    def _tile(j, n_tail, i_first, i_split, BT: gl.constexpr):
        """The first query index of step ``j``'s tile."""
        return gl.where(j < n_tail, i_split + j * BT, i_first + (j - n_tail) * BT)

    @gluon.jit
    def _copy_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                        qdo_ready, qdo_empty, lse, delta, gate, lse_frc, delta_frc, gate_frc, T, TK, q_offset, W,
                        H: gl.constexpr, G: gl.constexpr, BS: gl.constexpr, LOCAL: gl.constexpr,
                        GATED: gl.constexpr, FORCED: gl.constexpr, PHASED: gl.constexpr, STAGES: gl.constexpr):
        """One warp: both warpgroups' keys and values, then each step's ``q`` and ``do`` rows (one copy a
        position) into the step's slot once both warpgroups have released it, and the rows' vectors
        into the slot's ``rows_smem`` rows ``8 slot + r``: lse, delta, gate, then the selected branch's
        lse, delta and gate (``FORCED``)."""
        BNW: gl.constexpr = k_desc.block_type.shape[0]
        DH: gl.constexpr = k_desc.block_type.shape[1]
        M: gl.constexpr = q_smem.shape[1]
        BT: gl.constexpr = M // G
        i_b = gl.program_id(1) // H
        i_h = gl.program_id(1) % H
        steps, n_tail, i_first, i_split, i_local = _band(T, q_offset, W, BT, 2 * BNW, BS, LOCAL, FORCED, PHASED)
        mbarrier.expect(kv_bar, 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
        for c in gl.static_range(2):
            key0 = i_b * TK + gl.program_id(0) * 2 * BNW + c * BNW
            tma_load(k_desc, [key0, i_h * DH], kv_bar, k_smem.index(c))
            tma_load(v_desc, [key0, i_h * DH], kv_bar, v_smem.index(c))
        o_m = gl.arange(0, M, layout=gl.BlockedLayout([M // 32], [32], [1], [0]))
        for j in range(steps):
            slot = j % STAGES
            i = _tile(j, n_tail, i_first, i_split, BT)
            t_m = i + o_m // G
            m_m = t_m < T
            o_row = (i_b.to(gl.int64) * T + t_m) * (H * G) + i_h * G + o_m % G
            # rows past the last query: lse +inf makes their P, and so their dS, 0
            b_lse = gl.load(lse + o_row, mask=m_m, other=float("inf"))
            b_delta = gl.load(delta + o_row, mask=m_m, other=0.0)
            if GATED:
                b_gate = gl.load(gate + o_row, mask=m_m, other=0.0)
            if FORCED:
                f_lse = gl.load(lse_frc + o_row, mask=m_m, other=float("inf"))
                f_delta = gl.load(delta_frc + o_row, mask=m_m, other=0.0)
                if GATED:
                    f_gate = gl.load(gate_frc + o_row, mask=m_m, other=0.0)
            mbarrier.wait(qdo_empty.index(slot), (j // STAGES) & 1)
            bar = qdo_ready.index(slot)
            mbarrier.expect(bar, BT * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
            for p in gl.static_range(BT):
                row = ((i_b * T + gl.minimum(i + p, T - 1)) * H + i_h) * G
                tma_load(q_desc, [row, 0], bar, q_smem.index(slot).slice(p * G, G))
                tma_load(do_desc, [row, 0], bar, do_smem.index(slot).slice(p * G, G))
            rows_smem.index(8 * slot).store(b_lse)
            rows_smem.index(8 * slot + 1).store(b_delta)
            if GATED:
                rows_smem.index(8 * slot + 2).store(b_gate)
            if FORCED:
                rows_smem.index(8 * slot + 3).store(f_lse)
                rows_smem.index(8 * slot + 4).store(f_delta)
                if GATED:
                    rows_smem.index(8 * slot + 5).store(f_gate)
            mbarrier.arrive(bar)  # the barrier's second arrival: whoever waits on it sees the rows

    @gluon.jit
    def _row(rows_smem, r, st):
        """Row vector ``r`` of ``rows_smem`` as a ``[1, rows]`` tensor in the layout of the scores ``st``."""
        layout: gl.constexpr = gl.SliceLayout(0, st.type.layout)
        return gl.expand_dims(rows_smem.index(r).load(layout), 0)

    @gluon.jit
    def _window_share(st, dpt, band, rows_smem, slot, qk_scale, GATED: gl.constexpr):
        """The window's ``P^T`` (masked by the band, gated) and ``dS^T`` (float32) of a step."""
        pt = gl.where(band, gl.exp2(st * qk_scale - _row(rows_smem, 8 * slot, st)), 0.0)
        if GATED:
            pt = pt * _row(rows_smem, 8 * slot + 2, st)
        return pt, pt * (dpt - _row(rows_smem, 8 * slot + 1, st))

    @gluon.jit
    def _gradients(st, dpt, rows_smem, slot, i, i_local, o_s, o_m, q_offset, W, qk_scale, G: gl.constexpr,
                   BS: gl.constexpr, LOCAL: gl.constexpr, GATED: gl.constexpr, FORCED: gl.constexpr,
                   dtype: gl.constexpr):
        """A step's ``P^T`` and ``dS^T`` in ``dtype`` from its scores ``st`` and ``dpt``: masked by the
        band, gated, and with ``FORCED`` the selected branch's share where the step's rows hold one of
        the tile's blocks as a local one (rows before ``i_local``), as ``_dkdv_queries`` adds it. The
        two shares are computed in separate branches, the selected one's first, so that the scores'
        registers become the window's ``P^T`` (computed after the scores' other use, they spilled
        1.6 KB a thread)."""
        key = gl.expand_dims(o_s, 1)
        pos = gl.expand_dims(q_offset + i + o_m // G, 0)
        band = (key <= pos) & (key > pos - W)
        if FORCED:
            if i < i_local:
                local = band & (pos // BS - key // BS < LOCAL)
                f_pt = gl.where(local, gl.exp2(st * qk_scale - _row(rows_smem, 8 * slot + 3, st)), 0.0)
                if GATED:
                    f_pt = f_pt * _row(rows_smem, 8 * slot + 5, st)
                pt, dst = _window_share(st, dpt, band, rows_smem, slot, qk_scale, GATED)
                dst = dst + f_pt * (dpt - _row(rows_smem, 8 * slot + 4, st))
                pt = pt + f_pt
            else:
                pt, dst = _window_share(st, dpt, band, rows_smem, slot, qk_scale, GATED)
        else:
            pt, dst = _window_share(st, dpt, band, rows_smem, slot, qk_scale, GATED)
        return pt.to(dtype), dst.to(dtype)

    @gluon.jit
    def _compute_partition(dk, dv, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar, qdo_ready, qdo_empty,
                           T, TK, q_offset, W, qk_scale, scale, H: gl.constexpr, G: gl.constexpr, BS: gl.constexpr,
                           LOCAL: gl.constexpr, GATED: gl.constexpr, FORCED: gl.constexpr, PHASED: gl.constexpr,
                           ACC: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr):
        """Warpgroup ``WG``'s 64 keys over the band's query tiles (the module's docstring gives a step's
        order); then its ``dK`` (times ``scale``) and ``dV`` rows."""
        M: gl.constexpr = q_smem.shape[1]
        DH: gl.constexpr = q_smem.shape[2]
        BNW: gl.constexpr = k_smem.shape[1]
        BT: gl.constexpr = M // G
        st_layout: gl.constexpr = wgmma_layout(M)
        acc_layout: gl.constexpr = wgmma_layout(DH)
        a_layout: gl.constexpr = a_operand_layout(acc_layout)
        i_b = gl.program_id(1) // H
        i_h = gl.program_id(1) % H
        steps, n_tail, i_first, i_split, i_local = _band(T, q_offset, W, BT, 2 * BNW, BS, LOCAL, FORCED, PHASED)
        n0 = gl.program_id(0) * 2 * BNW + WG * BNW  # the warpgroup's first key
        o_s = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, st_layout))
        o_m = gl.arange(0, M, layout=gl.SliceLayout(0, st_layout))
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
            i = _tile(0, n_tail, i_first, i_split, BT)
            st, dpt = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
            for j in range(steps - 1):
                slot = j % STAGES
                nxt = (j + 1) % STAGES
                pt, dst = _gradients(st, dpt, rows_smem, slot, i, i_local, o_s, o_m, q_offset, W, qk_scale, G, BS,
                                     LOCAL, GATED, FORCED, q_smem.dtype)
                dv_acc = warpgroup_mma(gl.convert_layout(pt, a_layout), do_smem.index(slot), dv_acc, is_async=True)
                dk_acc = warpgroup_mma(gl.convert_layout(dst, a_layout), q_smem.index(slot), dk_acc, is_async=True)
                mbarrier.wait(qdo_ready.index(nxt), ((j + 1) // STAGES) & 1)
                s_tok = warpgroup_mma(k, q_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False, is_async=True)
                dp_tok = warpgroup_mma(v, do_smem.index(nxt).permute((1, 0)), st_zero, use_acc=False,
                                       is_async=True)
                i = _tile(j + 1, n_tail, i_first, i_split, BT)
                st, dpt, dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(s_tok, dp_tok, dv_acc, dk_acc))
                mbarrier.arrive(qdo_empty.index(slot))
            last = (steps - 1) % STAGES
            pt, dst = _gradients(st, dpt, rows_smem, last, i, i_local, o_s, o_m, q_offset, W, qk_scale, G, BS, LOCAL,
                                 GATED, FORCED, q_smem.dtype)
            dv_acc = warpgroup_mma(gl.convert_layout(pt, a_layout), do_smem.index(last), dv_acc, is_async=True)
            dk_acc = warpgroup_mma(gl.convert_layout(dst, a_layout), q_smem.index(last), dk_acc, is_async=True)
            dv_acc, dk_acc = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc))
        o_r = n0 + gl.arange(0, BNW, layout=gl.SliceLayout(1, acc_layout))
        o_d = gl.expand_dims(gl.arange(0, DH, layout=gl.SliceLayout(0, acc_layout)), 0)
        offs = gl.expand_dims(((i_b.to(gl.int64) * TK + o_r) * H + i_h) * DH, 1) + o_d  # [B, TK, H, DH]
        m_r = gl.expand_dims(o_r < TK, 1) & (o_d < DH)
        store_scaled(dk, dk_acc, offs, m_r, scale, ACC)
        store_scaled(dv, dv_acc, offs, m_r, 1.0, ACC)

    @gluon.jit
    def window_bwd_dkdv_gluon_kernel(
        q_desc, do_desc, k_desc, v_desc,  # q/do [B*T*HQ, D] (G rows a copy), k/v [B*TK, H*D] (64 keys a copy)
        dk, dv, lse, delta, gate, lse_frc, delta_frc, gate_frc,
        T, TK, q_offset, W, qk_scale, scale,
        H: gl.constexpr, G: gl.constexpr, BS: gl.constexpr, LOCAL: gl.constexpr, GATED: gl.constexpr,
        FORCED: gl.constexpr, PHASED: gl.constexpr, ACC: gl.constexpr, STAGES: gl.constexpr,
    ):
        """Grid ``(key tiles of 128, B * H)``, ``num_warps=4`` (the default partition is warpgroup 0),
        ``maxnreg=168``: the computing warpgroups get 240 registers, the copy warp 24."""
        DH: gl.constexpr = q_desc.block_type.shape[1]
        BNW: gl.constexpr = k_desc.block_type.shape[0]
        M: gl.constexpr = BNW  # 64 rows a step
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, M, DH], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, M, DH], do_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, BNW, DH], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, BNW, DH], v_desc.layout)
        # slot s's row vectors in rows 8 s + r (see _copy_partition): shapes are powers of two
        gl.static_assert(STAGES == 2 or STAGES == 4)
        rows_smem = gl.allocate_shared_memory(gl.float32, [8 * STAGES, M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        kv_bar, qdo_ready, qdo_empty = ring_barriers(STAGES, 2)  # the consumers: both warpgroups
        WG0: gl.constexpr = 0
        WG1: gl.constexpr = 1
        gl.warp_specialize([
            (_compute_partition, (dk, dv, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar, qdo_ready, qdo_empty,
                                  T, TK, q_offset, W, qk_scale, scale, H, G, BS, LOCAL, GATED, FORCED, PHASED, ACC,
                                  WG0, STAGES)),
            (_compute_partition, (dk, dv, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar, qdo_ready, qdo_empty,
                                  T, TK, q_offset, W, qk_scale, scale, H, G, BS, LOCAL, GATED, FORCED, PHASED, ACC,
                                  WG1, STAGES)),
            (_copy_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, rows_smem, kv_bar,
                               qdo_ready, qdo_empty, lse, delta, gate, lse_frc, delta_frc, gate_frc, T, TK, q_offset,
                               W, H, G, BS, LOCAL, GATED, FORCED, PHASED, STAGES)),
        ], [4, 1], [240, 24])


def window_bwd_dkdv_gluon(q, k, v, do, gate, lse, delta, dk, dv, frc, T: int, q_offset: int, window: int,
                          qk_scale: float, scale: float, forced: tuple, phased: bool, acc: bool) -> None:
    """Launch the kernel over ``window_bwd_dkdv_kernel``'s grid: ``dk``/``dv`` (with ``acc``, added to
    what they hold); ``frc`` the selected branch's ``(gate, lse, delta)`` (placeholders without
    ``forced``), ``forced`` ``(FORCED, BS, LOCAL)``; inputs contiguous, ``gate`` None or float32
    ``[B, T, HQ]``. A Triton whose Gluon cannot build it raises naming the flag that turns it off."""
    B, _, HQ, _ = q.shape
    TK, H = k.shape[1], k.shape[2]
    G = HQ // H
    q_desc, do_desc, k_desc, v_desc = launch_descriptors((q, do), (k, v), KEYS_PER_WARPGROUP)
    gate_frc, lse_frc, delta_frc = frc
    grid = (-(-TK // (2 * KEYS_PER_WARPGROUP)), B * H)
    try:
        window_bwd_dkdv_gluon_kernel[grid](
            q_desc, do_desc, k_desc, v_desc, dk, dv, lse, delta, lse if gate is None else gate, lse_frc, delta_frc,
            gate_frc, T, TK, q_offset, window, qk_scale, scale, H=H, G=G, BS=forced[1], LOCAL=forced[2],
            GATED=gate is not None, FORCED=forced[0], PHASED=phased, ACC=acc, STAGES=STAGES, **LAUNCH_OPTIONS)
    except Exception as exc:  # Gluon is experimental: its API moves between Triton releases
        raise launch_failed("the window dK/dV", "NSA_GLUON_WINDOW_DKDV", exc) from exc


def compile_for_hopper(G: int = 16, gated: bool = True, forced: bool = True, dtype: torch.dtype = torch.bfloat16):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU: what
    :func:`window_bwd_dkdv_gluon` would launch for ``G`` query heads a KV head (head dim 128) in the NSA
    prefill (the selected branch's local blocks, phased, added to its gradient). Returns Triton's
    compiled kernel (``asm``, ``metadata``)."""
    D = 128
    values = dict(H=4, G=G, BS=64, LOCAL=2, GATED=gated, FORCED=forced, PHASED=True, ACC=True, STAGES=STAGES)
    el = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    signature = {**descriptor_signature(dtype, G, KEYS_PER_WARPGROUP, ("q_desc", "do_desc"), ("k_desc", "v_desc"),
                                        D),
                 "dk": el, "dv": el, **{name: "*fp32" for name in ("lse", "delta", "gate", "lse_frc", "delta_frc",
                                                                    "gate_frc")},
                 "T": "i32", "TK": "i32", "q_offset": "i32", "W": "i32", "qk_scale": "fp32", "scale": "fp32",
                 **{name: "constexpr" for name in values}}
    return compile_for_sm90(window_bwd_dkdv_gluon_kernel, signature, values, LAUNCH_OPTIONS)
