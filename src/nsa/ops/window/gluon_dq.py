"""The window branch's dQ on Hopper, warp-specialised (Gluon): ``window_bwd_dq_kernel``
(:mod:`nsa.ops.window.backward`) in the form of the window's Gluon dK/dV
(:mod:`nsa.ops.window.gluon_dkdv`), the roles of queries and keys swapped.

Why: at 64k the Triton kernel takes 5.2-5.4 ms of the forward+backward's 87 (H200, session 64),
while the dK/dV over the same band, in Gluon, runs at about 390 TFLOP/s; the dQ's programs are short
(a query tile's band is 9 key tiles), so each program's loads and its start weigh on it. This kernel
takes 4.19-4.25 ms, its first form, one program a pair of query tiles, 4.68-4.71 (session 65).

A work item is two of the Triton kernel's query tiles (``2 BT`` positions of one KV head's ``G``
heads, 128 rows), one a computing warpgroup; the kernel is persistent: one program an SM walks the
items ``program_id, program_id + programs, ...`` (those running at a time are neighbouring tiles of one
head, whose keys L2 then serves once). One warp copies: an item's ``q`` and ``do`` rows (one copy a
position: its ``G`` heads are contiguous) as soon as both warpgroups have issued the previous item's
last products that read them, then each key tile of the item's band, 64 keys of ``k`` and ``v``, into
a ring of slots that both warpgroups read and that runs on across items. So the next item's rows and
first tiles arrive while the warpgroups finish an item and store its ``dQ``. A warpgroup's step issues the
previous tile's ``dQ += dS K``, then this tile's ``S = Q K^T`` and ``dP = dO V^T``, waits for all three
and releases the previous slot. The rows' lse, delta and gate stay in registers. The tiles are the
window's band (masked) and, with ``FORCED``, the selected branch's forced blocks as the Triton kernel
takes them: its local blocks are the band's last tiles, whose scores the two branches share, and each
initial block left of them is one more step of the selected branch alone. Rows past the last query
get an lse of +inf, which makes their ``P`` and ``dS`` 0; their ``dQ`` is not stored.

Gluon has no CPU interpreter: the kernel runs on Hopper GPUs only, where the GPU tests compare it with
the Triton kernel (``tests/ops/test_gluon_window_dq.py``); the CPU tests compile it for sm_90 with the
installed Triton (:func:`compile_for_hopper`). :func:`fits` says where it applies.
"""

from __future__ import annotations

import torch

from nsa import flags
from nsa.ops._gluon import PAIR_LAUNCH as LAUNCH_OPTIONS  # two computing warpgroups, a copy warp
from nsa.ops._gluon import (a_operand_layout, compile_for_sm90, copies_fit, descriptor_signature, fill_key_slot, gl,
                            gluon, head_item, head_items_grid, launch_descriptors, launch_failed, mbarrier, on_hopper,
                            released_barrier, ring_barriers, store_scaled, tma_load, warpgroup_mma, warpgroup_mma_wait,
                            wgmma_layout)

#: Query rows a computing warpgroup owns ((position, head) pairs of one KV group; two a program).
ROWS = 64
#: Keys a step (a slot of the ring), the selection block of the NSA prefill's forced share.
KEYS = 64
#: Slots of the key/value ring.
STAGES = 4


def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, q_offset: int,
         forced_block: int = 0) -> bool:
    """Whether this kernel replaces the Triton dQ: ``NSA_GLUON_WINDOW_DQ`` on, a Hopper GPU with Gluon,
    and inputs it takes (:func:`shapes_fit`)."""
    return flags.get("NSA_GLUON_WINDOW_DQ") and on_hopper(q) and shapes_fit(q, k, v, do, q_offset, forced_block)


def shapes_fit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, q_offset: int,
               forced_block: int = 0) -> bool:
    """Contiguous 16-bit inputs with 128-wide heads (the TMA copies take them as row matrices) and 8-64
    heads a KV head; with the selected branch's forced blocks (``forced_block``, their size; 0
    without), blocks of 64 keys, each holding whole programs (``q_offset`` a multiple of a program's
    ``2 BT`` positions), as the forced share needs a program's positions in one block."""
    G = copies_fit(q, k, v, do)
    if not G:
        return False
    positions = 2 * ROWS // G
    return not forced_block or (forced_block == KEYS and q_offset % positions == 0)


if gluon is not None:

    @gluon.jit
    def _band(pair, T, q_offset, W, BT: gl.constexpr, BN: gl.constexpr, INIT: gl.constexpr, LOCAL: gl.constexpr,
              FORCED: gl.constexpr):
        """``(n_win, steps, first, s_local)`` of query tiles ``2 pair`` and the next: the band's
        key tiles from ``first`` (``n_win`` of them; from ``s_local`` on, with ``FORCED``, the selected
        branch's local blocks too), then the initial blocks left of ``s_local`` (``steps - n_win``):
        ``key_band``'s and the Triton kernel's arithmetic over the program's ``2 BT`` positions (Gluon
        cannot call Triton functions; the GPU tests keep the two in step)."""
        t_lo = q_offset + pair * 2 * BT
        t_hi = gl.minimum(t_lo + 2 * BT, q_offset + T) - 1
        first = gl.maximum(t_lo - W + 1, 0) // BN * BN
        n_win = (t_hi - first) // BN + 1
        steps = n_win
        s_local = t_hi + 1
        if FORCED:
            s_local = gl.maximum(t_lo // BN - LOCAL + 1, 0) * BN
            steps = n_win + gl.cdiv(gl.minimum(INIT * BN, s_local), BN)
        return n_win, steps, first, s_local

    @gluon.jit
    def _key_tile(j, n_win, first, BN: gl.constexpr):
        """The first key of step ``j``'s tile: the band's, then the initial blocks'."""
        return gl.where(j < n_win, first + j * BN, (j - n_win) * BN)

    @gluon.jit
    def _copy_partition(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_free,
                        kv_ready, kv_empty, T, TK, q_offset, W, n_items, H: gl.constexpr, G: gl.constexpr,
                        INIT: gl.constexpr, LOCAL: gl.constexpr, FORCED: gl.constexpr, STAGES: gl.constexpr):
        """One warp: each item's ``q`` and ``do`` rows (one copy a position; positions past the last query
        copy the last one's) once both warpgroups have released the previous item's, then each step's key
        tile into its slot once both warpgroups have released it; ``g`` counts the ring's steps."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DH: gl.constexpr = k_desc.block_type.shape[1]
        BT: gl.constexpr = q_smem.shape[1] // G
        g = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_b, i_h, pair = head_item(item, gl.cdiv(T, 2 * BT), H)
            i0 = pair * 2 * BT
            n_win, steps, first, s_local = _band(pair, T, q_offset, W, BT, BN, INIT, LOCAL, FORCED)
            mbarrier.wait(qdo_free, it & 1)
            mbarrier.expect(qdo_ready, 2 * BT * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
            for p in gl.static_range(2 * BT):
                row = ((i_b * T + gl.minimum(i0 + p, T - 1)) * H + i_h) * G
                tma_load(q_desc, [row, 0], qdo_ready, q_smem.index(p // BT).slice((p % BT) * G, G))
                tma_load(do_desc, [row, 0], qdo_ready, do_smem.index(p // BT).slice((p % BT) * G, G))
            for j in range(steps):
                fill_key_slot(k_desc, v_desc, k_smem, v_smem, kv_ready, kv_empty, g + j, i_b * TK + _key_tile(j, n_win, first, BN),
                              i_h * DH, STAGES)
            g += steps
            it += 1

    @gluon.jit
    def _rows(x, o_row, m_row, other):
        """``x[o_row]`` as a ``[rows, 1]`` column, ``other`` where ``m_row`` is false."""
        return gl.expand_dims(gl.load(x + o_row, mask=m_row, other=other), 1)

    @gluon.jit
    def _ds_of(s, dp, lse, delta, gate, visible, qk_scale, GATED: gl.constexpr, MASK: gl.constexpr):
        """One branch's ``dS`` (float32) of a step's scores ``s`` and ``dP`` tile ``dp`` from its rows' lse,
        delta and gate (``[rows, 1]``), where ``visible`` with ``MASK``: ``P (dP - delta)`` times the
        gate, as ``attn_bwd_ds``."""
        p = gl.exp2(s * qk_scale - lse)
        if MASK:
            p = gl.where(visible, p, 0.0)
        if GATED:
            return p * (dp * gate - gate * delta)
        return p * (dp - delta)

    @gluon.jit
    def _ds(s, dp, j, n_win, first, s_local, o_n, pos, W, w_lse, w_delta, w_gate, f_lse, f_delta, f_gate, qk_scale,
            GATED: gl.constexpr, FORCED: gl.constexpr):
        """Step ``j``'s ``dS`` (float32) from its scores ``s`` and ``dP`` tile ``dp``: the window's over the
        band (rows at positions ``pos``, keys ``o_n`` of the step's tile) and, with ``FORCED``, the
        selected branch's on its local blocks (the band's last tiles, from ``s_local``: the same mask)
        and alone on its initial blocks (the steps from ``n_win``, before every row: no mask)."""
        BN: gl.constexpr = s.shape[1]
        s0 = _key_tile(j, n_win, first, BN)
        key = gl.expand_dims(s0 + o_n, 0)  # [1, BN]
        band = (key <= pos) & (key > pos - W)
        if FORCED:
            if j >= n_win:
                ds = _ds_of(s, dp, f_lse, f_delta, f_gate, band, qk_scale, GATED, False)
            elif s0 >= s_local:
                ds = _ds_of(s, dp, w_lse, w_delta, w_gate, band, qk_scale, GATED, True)
                ds = ds + _ds_of(s, dp, f_lse, f_delta, f_gate, band, qk_scale, GATED, True)
            else:
                ds = _ds_of(s, dp, w_lse, w_delta, w_gate, band, qk_scale, GATED, True)
        else:
            ds = _ds_of(s, dp, w_lse, w_delta, w_gate, band, qk_scale, GATED, True)
        return ds

    @gluon.jit
    def _compute_partition(dq, q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_free, kv_ready, kv_empty, lse, delta,
                           gate, lse_frc, delta_frc, gate_frc, T, q_offset, W, qk_scale, scale, n_items,
                           H: gl.constexpr, G: gl.constexpr, INIT: gl.constexpr, LOCAL: gl.constexpr,
                           GATED: gl.constexpr, FORCED: gl.constexpr, ACC: gl.constexpr, WG: gl.constexpr,
                           STAGES: gl.constexpr):
        """Warpgroup ``WG``'s 64 rows of each of the program's items over the item's key tiles (the
        module's docstring gives a step's order), then their ``dQ`` rows, times ``scale``; ``g`` counts
        the ring's steps as the copy warp does."""
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
        o_ma = gl.arange(0, M, layout=gl.SliceLayout(1, acc_layout))
        o_d = gl.expand_dims(gl.arange(0, DH, layout=gl.SliceLayout(0, acc_layout)), 0)
        q = q_smem.index(WG)
        do = do_smem.index(WG)
        s_zero = gl.zeros([M, BN], gl.float32, layout=s_layout)
        g = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_b, i_h, pair = head_item(item, gl.cdiv(T, 2 * BT), H)
            i0 = pair * 2 * BT + WG * BT  # the warpgroup's first query
            n_win, steps, first, s_local = _band(pair, T, q_offset, W, BT, BN, INIT, LOCAL, FORCED)
            t_m = i0 + o_m // G
            m_m = t_m < T
            o_row = (i_b.to(gl.int64) * T + t_m) * HQ + i_h * G + o_m % G
            pos = gl.expand_dims(q_offset + t_m, 1)  # [M, 1]
            # rows past the last query: lse +inf makes their P, and so their dS, 0
            w_lse = _rows(lse, o_row, m_m, float("inf"))
            w_delta = _rows(delta, o_row, m_m, 0.0)
            w_gate = w_lse  # read only with GATED
            if GATED:
                w_gate = _rows(gate, o_row, m_m, 0.0)
            f_lse, f_delta, f_gate = w_lse, w_delta, w_gate  # the selected branch's, read only with FORCED
            if FORCED:
                f_lse = _rows(lse_frc, o_row, m_m, float("inf"))
                f_delta = _rows(delta_frc, o_row, m_m, 0.0)
                if GATED:
                    f_gate = _rows(gate_frc, o_row, m_m, 0.0)
            dq_acc = gl.zeros([M, DH], gl.float32, layout=acc_layout)
            mbarrier.wait(qdo_ready, it & 1)
            # steps >= 1: every query's band holds its own key
            mbarrier.wait(kv_ready.index(g % STAGES), (g // STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(g % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dp_tok = warpgroup_mma(do, v_smem.index(g % STAGES).permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)
            s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
            for j in range(steps - 1):
                slot = (g + j) % STAGES
                nxt = (g + j + 1) % STAGES
                ds = _ds(s, dp, j, n_win, first, s_local, o_n, pos, W, w_lse, w_delta, w_gate, f_lse, f_delta,
                         f_gate, qk_scale, GATED, FORCED)
                dq_acc = warpgroup_mma(gl.convert_layout(ds.to(q_smem.dtype), a_layout), k_smem.index(slot), dq_acc,
                                       is_async=True)
                mbarrier.wait(kv_ready.index(nxt), ((g + j + 1) // STAGES) & 1)
                s_tok = warpgroup_mma(q, k_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                dp_tok = warpgroup_mma(do, v_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False, is_async=True)
                s, dp, dq_acc = warpgroup_mma_wait(0, deps=(s_tok, dp_tok, dq_acc))
                mbarrier.arrive(kv_empty.index(slot))
            mbarrier.arrive(qdo_free)  # the item's products that read q and do are done
            last = (g + steps - 1) % STAGES
            ds = _ds(s, dp, steps - 1, n_win, first, s_local, o_n, pos, W, w_lse, w_delta, w_gate, f_lse, f_delta,
                     f_gate, qk_scale, GATED, FORCED)
            dq_acc = warpgroup_mma(gl.convert_layout(ds.to(q_smem.dtype), a_layout), k_smem.index(last), dq_acc,
                                   is_async=True)
            dq_acc = warpgroup_mma_wait(0, deps=(dq_acc,))
            mbarrier.arrive(kv_empty.index(last))  # the ring runs on into the next item
            o_r = i0 + o_ma // G
            offs = gl.expand_dims(((i_b.to(gl.int64) * T + o_r) * HQ + i_h * G + o_ma % G) * DH, 1) + o_d
            store_scaled(dq, dq_acc, offs, gl.expand_dims(o_r < T, 1) & (o_d < DH), scale, ACC)
            g += steps
            it += 1

    @gluon.jit
    def window_bwd_dq_gluon_kernel(
        q_desc, do_desc, k_desc, v_desc,  # q/do [B*T*HQ, D] (G rows a copy), k/v [B*TK, H*D] (64 keys a copy)
        dq, lse, delta, gate, lse_frc, delta_frc, gate_frc,
        T, TK, q_offset, W, qk_scale, scale, n_items,
        H: gl.constexpr, G: gl.constexpr, INIT: gl.constexpr, LOCAL: gl.constexpr, GATED: gl.constexpr,
        FORCED: gl.constexpr, ACC: gl.constexpr, STAGES: gl.constexpr,
    ):
        """Grid ``(programs,)``, at most one an SM, over ``n_items`` pairs of query tiles (``B H`` times
        ``cdiv(T, 2 BT)``), ``num_warps=4`` (the default partition is warpgroup 0), ``maxnreg=168``: the
        computing warpgroups get 240 registers, the copy warp 24."""
        DH: gl.constexpr = q_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        M: gl.constexpr = 64  # rows a warpgroup
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, M, DH], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [2, M, DH], do_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, DH], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, DH], v_desc.layout)
        qdo_ready, kv_ready, kv_empty = ring_barriers(STAGES, 2)  # the consumers: both warpgroups
        qdo_free = released_barrier(2)  # both warpgroups, once an item's products that read q and do are done
        WG0: gl.constexpr = 0
        WG1: gl.constexpr = 1
        gl.warp_specialize([
            (_compute_partition, (dq, q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_free, kv_ready, kv_empty, lse,
                                  delta, gate, lse_frc, delta_frc, gate_frc, T, q_offset, W, qk_scale, scale, n_items,
                                  H, G, INIT, LOCAL, GATED, FORCED, ACC, WG0, STAGES)),
            (_compute_partition, (dq, q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_free, kv_ready, kv_empty, lse,
                                  delta, gate, lse_frc, delta_frc, gate_frc, T, q_offset, W, qk_scale, scale, n_items,
                                  H, G, INIT, LOCAL, GATED, FORCED, ACC, WG1, STAGES)),
            (_copy_partition, (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, qdo_ready, qdo_free,
                               kv_ready, kv_empty, T, TK, q_offset, W, n_items, H, G, INIT, LOCAL, FORCED, STAGES)),
        ], [4, 1], [240, 24])


def window_bwd_dq_gluon(q, k, v, do, gate, lse, delta, dq, frc, T: int, q_offset: int, window: int,
                        qk_scale: float, scale: float, forced: tuple, acc: bool) -> None:
    """Launch the kernel: ``dq`` (with ``acc``, added to what it holds); ``frc`` the selected branch's
    ``(gate, lse, delta)`` (placeholders without ``forced``), ``forced`` ``(FORCED, INIT, LOCAL)``;
    inputs contiguous, ``gate`` None or float32 ``[B, T, HQ]``. A Triton whose Gluon cannot build it
    raises naming the flag that turns it off."""
    B, _, HQ, _ = q.shape
    TK, H = k.shape[1], k.shape[2]
    G = HQ // H
    q_desc, do_desc, k_desc, v_desc = launch_descriptors((q, do), (k, v), KEYS)
    gate_frc, lse_frc, delta_frc = frc
    n_items, grid = head_items_grid(B, H, -(-T // (2 * ROWS // G)), q.device)
    try:
        window_bwd_dq_gluon_kernel[grid](
            q_desc, do_desc, k_desc, v_desc, dq, lse, delta, lse if gate is None else gate, lse_frc, delta_frc,
            gate_frc, T, TK, q_offset, window, qk_scale, scale, n_items, H=H, G=G, INIT=forced[1], LOCAL=forced[2],
            GATED=gate is not None, FORCED=forced[0], ACC=acc, STAGES=STAGES, **LAUNCH_OPTIONS)
    except Exception as exc:  # Gluon is experimental: its API moves between Triton releases
        raise launch_failed("the window dQ", "NSA_GLUON_WINDOW_DQ", exc) from exc


def compile_for_hopper(G: int = 16, gated: bool = True, forced: bool = True, dtype: torch.dtype = torch.bfloat16):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU: what
    :func:`window_bwd_dq_gluon` would launch for ``G`` query heads a KV head (head dim 128) in the NSA
    prefill (the selected branch's initial and local blocks, added to its gradient). Returns Triton's
    compiled kernel (``asm``, ``metadata``)."""
    D = 128
    values = dict(H=4, G=G, INIT=1, LOCAL=2, GATED=gated, FORCED=forced, ACC=True, STAGES=STAGES)
    el = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    signature = {**descriptor_signature(dtype, G, KEYS, ("q_desc", "do_desc"), ("k_desc", "v_desc"), D),
                 "dq": el, **{name: "*fp32" for name in ("lse", "delta", "gate", "lse_frc", "delta_frc", "gate_frc")},
                 "T": "i32", "TK": "i32", "q_offset": "i32", "W": "i32", "qk_scale": "fp32", "scale": "fp32",
                 "n_items": "i32", **{name: "constexpr" for name in values}}
    return compile_for_sm90(window_bwd_dq_gluon_kernel, signature, values, LAUNCH_OPTIONS)
