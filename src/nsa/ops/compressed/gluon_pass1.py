"""Pass 1 of the compressed forward on Hopper, warp-specialised (Gluon): ``compressed_fwd_kernel``
(:mod:`nsa.ops._triton.compressed_fwd`) where pass 2 runs apart (``PASS2_APART``), in the form of
session 61's warp-specialised probe loop (``scripts/gpu_gluon_ws_probe.py``).

Why: at 64k pass 1 takes 8.3 ms of the forward, 528 TFLOP/s of useful work, where the probe's loop ran
549-607 on that shape (session 62, H200).

A work item is a Triton launch's program: 128 rows (``128 // G`` query positions of one KV head's ``G``
heads); a (batch, KV head)'s query tiles are consecutive, those that see the most compressed tokens
first. The kernel is persistent: one program an SM walks the items ``program_id, program_id +
programs, ...``. One warp copies: each warpgroup's 64 query rows (one copy a position: a position's heads
are contiguous) once that warpgroup has issued the previous item's last scores, then every key and
value tile of ``BN`` tokens the item's last query sees, into a ring of slots that runs on from one item
to the next. Two warpgroups compute, 64 rows each, in FlashAttention-3's order: a step issues this
tile's scores, rescales the accumulator while they run, issues the previous tile's ``P V``, waits for
the scores alone and runs their online softmax while ``P V`` runs, then waits for ``P V`` and releases
its slot. Tiles past the tokens the item's first query sees are masked by each row's visible count
(spec ``Nc(t)``). The outputs are the Triton launch's: ``o``, the natural-log ``lse`` and the
log2-domain ``lse2`` that pass 2 reads.

ptxas hoists a wgmma wait to the top of its block, so the wait for ``P V`` would land before the
exponentials and nothing would run beside them; it keeps the wait after a shared-memory store, so a
step stores its row sums (``sink``, never read) before that wait. Until session 69 a program took one
item and a step waited for both products before its softmax. The arithmetic is the same, bit for bit;
at 64k the kernel took 8.58-8.61 ms, 8.27-8.41 in this order, and persistent 7.46-7.47 against
8.15-8.30 on another machine (1.12x at 32k; H200, ``docs/perf/prefill.md``).

Gluon has no CPU interpreter: the kernel runs on Hopper GPUs only, where the GPU tests compare it with
the Triton launch (``tests/ops/test_gluon_pass1.py``); the CPU tests compile it for sm_90 with the
installed Triton (:func:`compile_for_hopper`). :func:`fits` says where it applies.
"""

from __future__ import annotations

import torch

from nsa import flags
from nsa.ops._gluon import PAIR_LAUNCH as LAUNCH_OPTIONS  # two computing warpgroups, a copy warp
from nsa.ops._gluon import (a_operand_layout, compile_for_sm90, copies_fit, descriptor_signature, fence_async_shared,
                            gl, gluon, head_item, head_items_grid, launch_descriptors, launch_failed, mbarrier,
                            on_hopper, tma_load, visible_compressed, warpgroup_mma, warpgroup_mma_wait, wgmma_layout)

#: Query rows a computing warpgroup owns (two an item: a Triton launch program's 128).
ROWS = 64
#: Compressed tokens a step (the probe's best: 128-token tiles in 3 slots).
TOKENS = 128
#: Slots of the key/value ring.
STAGES = 3


def fits(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor) -> bool:
    """Whether this kernel replaces the Triton pass 1: ``NSA_GLUON_COMPRESSED_PASS1`` on, a Hopper GPU
    with Gluon, and inputs it takes (:func:`shapes_fit`)."""
    return flags.get("NSA_GLUON_COMPRESSED_PASS1") and on_hopper(q) and shapes_fit(q, k_cmp, v_cmp)


def shapes_fit(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor) -> bool:
    """Contiguous 16-bit inputs with 128-wide heads (the TMA copies take them as row matrices) and 8-64
    query heads a KV head (64 rows a warpgroup: whole positions)."""
    return copies_fit(q, k_cmp, v_cmp) > 0


if gluon is not None:

    @gluon.jit
    def _item(item, TQ, H: gl.constexpr, BT: gl.constexpr):
        """``(i_t, i_b, i_h)`` of work item ``item``: a (batch, KV head)'s query tiles are consecutive, the
        last (longest walk) first, as the Triton launch orders them."""
        n_qt = gl.cdiv(TQ, BT)
        i_b, i_h, index = head_item(item, n_qt, H)
        return n_qt - 1 - index, i_b, i_h

    @gluon.jit
    def _copy_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, v_ready, kv_empty, TQ,
                        NC, q_offset, n_items, H: gl.constexpr, G: gl.constexpr, L: gl.constexpr, S: gl.constexpr,
                        STAGES: gl.constexpr):
        """One warp, item after item: each warpgroup's query rows once it has released the previous item's,
        then every key/value tile into its ring slot once both warpgroups have released the slot's
        previous tile (every slot starts released); ``g`` counts the ring's tiles across items."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DH: gl.constexpr = k_desc.block_type.shape[1]
        BTW: gl.constexpr = q_smem.shape[1] // G  # positions a warpgroup
        g = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_t, i_b, i_h = _item(item, TQ, H, 2 * BTW)
            for c in gl.static_range(2):
                mbarrier.wait(q_free.index(c), it & 1)
                mbarrier.expect(q_bar.index(c), BTW * q_desc.block_type.nbytes)
                for p in gl.static_range(BTW):
                    t = gl.minimum(i_t * 2 * BTW + c * BTW + p, TQ - 1)  # a position past the last: any real one
                    tma_load(q_desc, [((i_b * TQ + t) * H + i_h) * G, 0], q_bar.index(c),
                             q_smem.index(c).slice(p * G, G))
            n_hi = visible_compressed(q_offset + gl.minimum(i_t * 2 * BTW + 2 * BTW, TQ) - 1, NC, L, S)
            key0 = i_b * NC
            n_tiles = gl.cdiv(n_hi, BN)
            for j in range(n_tiles):
                slot = (g + j) % STAGES
                mbarrier.wait(kv_empty.index(slot), ((g + j) // STAGES) & 1)
                # keys and values on barriers of their own: the scores need not wait for the values
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                tma_load(k_desc, [key0 + j * BN, i_h * DH], k_ready.index(slot), k_smem.index(slot))
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                tma_load(v_desc, [key0 + j * BN, i_h * DH], v_ready.index(slot), v_smem.index(slot))
            g += n_tiles
            it += 1

    @gluon.jit
    def _pinned(x):
        """``x`` through an opaque copy that keeps its place among the wgmma issues."""
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=False, pack=1)

    @gluon.jit
    def _softmax(s, m_i, l_i, n0, o_n, nv, n_full, qk_scale):
        """One tile's online softmax on raw scores ``s`` (tokens ``n0 + o_n``; past ``n_full`` masked
        by each row's visible count ``nv``): ``(p, alpha, m, l)``. A row that has seen nothing shifts by
        0, so that no exponent sees -inf - -inf."""
        if n0 >= n_full:
            s = gl.where(gl.expand_dims(n0 + o_n, 0) < gl.expand_dims(nv, 1), s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        shift = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s * qk_scale - gl.expand_dims(shift, 1))
        alpha = gl.exp2(m_i - shift)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _compute_partition(o, lse, lse2, sink, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, v_ready, kv_empty, TQ,
                           NC, q_offset, qk_scale, n_items, H: gl.constexpr, G: gl.constexpr, L: gl.constexpr,
                           S: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr):
        """Warpgroup ``WG``'s 64 rows of each of the program's items over the item's tiles (the module's
        docstring gives a step's order); then its rows of ``o``, ``lse`` (natural log) and ``lse2``
        (log2), as ``attn_fwd_finish`` leaves them (a row that saw nothing: ``o = 0``, lse -inf); ``g``
        counts the ring's tiles as the copy warp does."""
        M: gl.constexpr = q_smem.shape[1]
        DH: gl.constexpr = q_smem.shape[2]
        BN: gl.constexpr = k_smem.shape[1]
        BTW: gl.constexpr = M // G
        s_layout: gl.constexpr = wgmma_layout(BN)
        o_layout: gl.constexpr = wgmma_layout(DH)
        p_layout: gl.constexpr = a_operand_layout(o_layout)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        o_m = gl.arange(0, M, layout=row_s)
        o_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        o_c = gl.arange(0, DH, layout=gl.SliceLayout(0, o_layout))
        q = q_smem.index(WG)
        s_zero = gl.zeros([M, BN], gl.float32, layout=s_layout)
        g = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            i_t, i_b, i_h = _item(item, TQ, H, 2 * BTW)
            t0 = i_t * 2 * BTW  # the item's first query
            nv = visible_compressed(q_offset + t0 + WG * BTW + o_m // G, NC, L, S)
            n_full = visible_compressed(q_offset + t0, NC, L, S) // BN * BN  # every row sees the tiles before
            n_hi = visible_compressed(q_offset + gl.minimum(t0 + 2 * BTW, TQ) - 1, NC, L, S)
            n_tiles = gl.cdiv(n_hi, BN)
            m_i = gl.full([M], float("-inf"), gl.float32, layout=row_s)
            l_i = gl.zeros([M], gl.float32, layout=row_s)
            acc = gl.zeros([M, DH], gl.float32, layout=o_layout)
            mbarrier.wait(q_bar.index(WG), it & 1)
            if n_tiles > 0:
                mbarrier.wait(k_ready.index(g % STAGES), (g // STAGES) & 1)
                s_tok = warpgroup_mma(q, k_smem.index(g % STAGES).permute((1, 0)), s_zero, use_acc=False,
                                      is_async=True)
                s = warpgroup_mma_wait(0, deps=(s_tok,))
                p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, o_n, nv, n_full, qk_scale)
                p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
                for j in range(1, n_tiles):
                    slot = (g + j) % STAGES
                    prev = (g + j - 1) % STAGES
                    mbarrier.wait(k_ready.index(slot), ((g + j) // STAGES) & 1)
                    s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                          is_async=True)
                    # the previous softmax's rescale while the scores run (alpha through an opaque copy: LLVM
                    # would hoist the product into the previous step, before the wait for that step's P V)
                    acc = acc * gl.expand_dims(gl.convert_layout(_pinned(alpha), row_o), 1)
                    mbarrier.wait(v_ready.index(prev), ((g + j - 1) // STAGES) & 1)
                    acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                    s = warpgroup_mma_wait(1, deps=(s_tok,))  # the scores; P V runs on beside their softmax
                    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j * BN, o_n, nv, n_full, qk_scale)
                    # a store ptxas keeps before the wait below, which so stays after the exponentials
                    sink.index(WG).store(l_i)
                    acc = warpgroup_mma_wait(0, deps=(acc,))
                    mbarrier.arrive(kv_empty.index(prev))
                    p_op = gl.convert_layout(p.to(q_smem.dtype), p_layout)
                mbarrier.arrive(q_free.index(WG))  # the item's products that read q are done
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
                last = (g + n_tiles - 1) % STAGES
                mbarrier.wait(v_ready.index(last), ((g + n_tiles - 1) // STAGES) & 1)
                acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc,))
                mbarrier.arrive(kv_empty.index(last))  # the ring runs on into the next item
            else:
                mbarrier.arrive(q_free.index(WG))
            seen = l_i > 0
            out = acc / gl.expand_dims(gl.convert_layout(gl.where(seen, l_i, 1.0), row_o), 1)
            b_lse2 = gl.where(seen, m_i + gl.log2(gl.where(seen, l_i, 1.0)), float("-inf"))
            o_tq = t0 + WG * BTW + o_m // G
            o_row = (i_b.to(gl.int64) * TQ + o_tq) * (H * G) + i_h * G + o_m % G  # rows of [B * TQ * HQ]
            real = o_tq < TQ
            gl.store(lse + o_row, b_lse2 * 0.6931471805599453, mask=real)
            gl.store(lse2 + o_row, b_lse2, mask=real)
            o_ro = gl.convert_layout(o_row, row_o)
            gl.store(o + gl.expand_dims(o_ro * DH, 1) + gl.expand_dims(o_c, 0), out.to(o.dtype.element_ty),
                     mask=gl.expand_dims(gl.convert_layout(real, row_o), 1) & gl.expand_dims(o_c < DH, 0))
            g += n_tiles
            it += 1

    @gluon.jit
    def compressed_pass1_gluon_kernel(
        q_desc, k_desc, v_desc,  # q [B*TQ*HQ, D] (G rows a copy), k/v [B*NC, H*D] (TOKENS a copy)
        o, lse, lse2, TQ, NC, q_offset, qk_scale, n_items,
        H: gl.constexpr, G: gl.constexpr, L: gl.constexpr, S: gl.constexpr, STAGES: gl.constexpr,
    ):
        """Grid ``(programs,)``, at most one an SM, over ``n_items`` query tiles of 128 rows (``B H``
        times ``cdiv(TQ, 128 // G)``), ``num_warps=4`` (the default partition is warpgroup 0),
        ``maxnreg=168``: the computing warpgroups get 240 registers, the copy warp 24."""
        DH: gl.constexpr = q_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        M: gl.constexpr = 64
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, M, DH], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, DH], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, DH], v_desc.layout)
        sink = gl.allocate_shared_memory(gl.float32, [2, M], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # never read
        q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(2):
            mbarrier.init(q_bar.index(c), count=1)
            mbarrier.init(q_free.index(c), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(kv_empty.index(i), count=2)
        fence_async_shared()
        for i in gl.static_range(STAGES):  # every slot starts released by both warpgroups
            mbarrier.arrive(kv_empty.index(i), count=2)
        for c in gl.static_range(2):  # and each warpgroup's query rows
            mbarrier.arrive(q_free.index(c))
        WG0: gl.constexpr = 0
        WG1: gl.constexpr = 1
        gl.warp_specialize([
            (_compute_partition, (o, lse, lse2, sink, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, v_ready,
                                  kv_empty, TQ, NC, q_offset, qk_scale, n_items, H, G, L, S, WG0, STAGES)),
            (_compute_partition, (o, lse, lse2, sink, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, v_ready,
                                  kv_empty, TQ, NC, q_offset, qk_scale, n_items, H, G, L, S, WG1, STAGES)),
            (_copy_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, k_ready, v_ready,
                               kv_empty, TQ, NC, q_offset, n_items, H, G, L, S, STAGES)),
        ], [4, 1], [240, 24])


def compressed_pass1_gluon(q, k_cmp, v_cmp, o, lse, lse2, q_offset: int, qk_scale: float, L: int, S: int) -> None:
    """Launch the kernel over the Triton pass 1's query tiles (128 rows each): ``o [B, TQ, HQ, D]``,
    ``lse`` (natural log) and ``lse2`` (log2) ``[B, TQ, HQ]``. A Triton whose Gluon cannot build it
    raises naming the flag that turns it off."""
    B, TQ, HQ, _ = q.shape
    NC, H = k_cmp.shape[1], k_cmp.shape[2]
    G = HQ // H
    q_desc, k_desc, v_desc = launch_descriptors((q,), (k_cmp, v_cmp), TOKENS)
    n_items, grid = head_items_grid(B, H, -(-TQ // (2 * ROWS // G)), q.device)
    try:
        compressed_pass1_gluon_kernel[grid](q_desc, k_desc, v_desc, o, lse, lse2, TQ, NC, q_offset, qk_scale, n_items,
                                            H=H, G=G, L=L, S=S, STAGES=STAGES, **LAUNCH_OPTIONS)
    except Exception as exc:  # Gluon is experimental: its API moves between Triton releases
        raise launch_failed("the compressed forward's pass 1", "NSA_GLUON_COMPRESSED_PASS1", exc) from exc


def compile_for_hopper(G: int = 16, dtype: torch.dtype = torch.bfloat16):
    """The kernel compiled for sm_90 with the installed Triton, without a GPU: what
    :func:`compressed_pass1_gluon` would launch for ``G`` query heads a KV head (head dim 128) and the
    paper's compression geometry. Returns Triton's compiled kernel (``asm``, ``metadata``)."""
    D = 128
    values = dict(H=4, G=G, L=32, S=16, STAGES=STAGES)
    el = "*bf16" if dtype == torch.bfloat16 else "*fp16"
    signature = {**descriptor_signature(dtype, G, TOKENS, ("q_desc",), ("k_desc", "v_desc"), D),
                 "o": el, "lse": "*fp32", "lse2": "*fp32",
                 "TQ": "i32", "NC": "i32", "q_offset": "i32", "qk_scale": "fp32", "n_items": "i32",
                 **{name: "constexpr" for name in values}}
    return compile_for_sm90(compressed_pass1_gluon_kernel, signature, values, LAUNCH_OPTIONS)
