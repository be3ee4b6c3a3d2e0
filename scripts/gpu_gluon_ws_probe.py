"""Does a warp-specialised Gluon attention loop (a copy warp, two computing warpgroups taking turns
on the tensor cores) beat Triton's on Hopper? A probe, no library code.

Why: session 60's Gluon probe (``scripts/gpu_gluon_probe.py``) found a plain Gluon loop only 2 %
faster than Triton's (528 against 519 TFLOP/s on the compressed forward's shape), and overlapping a
tile's exponentials with the next tile's product inside one warpgroup no faster. The hand-written
Hopper kernels that reach 600-700 TFLOP/s split the work differently: one warp issues the bulk
copies, and two warpgroups each own a row tile; a warpgroup issues both of its products (this tile's
scores, the previous tile's ``P V``) and then hands the tensor cores to the other, so that each
warpgroup's exponentials run while the other's products do. Nothing in the Triton language can
express that; Gluon's ``warp_specialize`` and mbarriers can.

The kernel ``attn_fwd_ws_kernel`` has the problem of the earlier probes (rows ``(query, head)``
pairs of one KV group, a shared ``[N, 128]`` key stream per group, bf16 in, float32 softmax in the
log2 domain), so their TFLOP/s compare. A program owns ``2 * BM`` rows:

- the copy partition (one warp) loads both row tiles' queries, then each key and value tile into a
  ring of ``STAGES`` slots, a slot reused once both warpgroups have released it;
- each computing warpgroup (the default partition, and a worker of 4 warps) walks every key tile.
  Step ``j`` issues the scores of tile ``j`` and the ``P V`` of tile ``j - 1``, waits for both,
  releases tile ``j - 1``'s slot, and runs tile ``j``'s softmax;
- ``PINGPONG``: a warpgroup waits for its turn before issuing a step's products and gives the turn
  to the other once they are issued (two mbarriers), so the two alternate on the tensor cores.

Usage: ``python scripts/gpu_gluon_ws_probe.py [--rows 262144] [--keys 2048] [--configs I ...]``
(Hopper GPU): each configuration checked against torch (float32) on a small problem, then timed
(``do_bench`` median, L2 flushed), with session 60's best plain Gluon loop and Triton's loop timed in
the same process. ``--compile-only`` compiles each configuration for sm_90 without a GPU and prints
registers, spills and ptxas's notes.

Session 61, H200 (docs/perf/prefill.md): 2 x 64 rows, 128-key tiles, 3 slots, 549-551 TFLOP/s at 2048
keys and 600-607 at 8192, against Triton's 512-514 and 531 (7 % and 14 %); the turns add nothing.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from gpu_gluon_probe import (D, GROUPS, LOG2E, _descriptors, _softmax, parse_run_arguments, compile_report,  # scripts/
                             forward_signature)

#: Computing warpgroups a program.
CONSUMERS = gl.constexpr(2)


@gluon.jit
def _copy_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, ROWS, N,
                    STAGES: gl.constexpr):
    """One warp: both row tiles' queries, then every key/value tile into its ring slot once the slot's
    previous tile is released (its barrier starts with that phase already complete)."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    row0 = gl.program_id(1) * ROWS + gl.program_id(0) * (CONSUMERS * BM)
    key0 = gl.program_id(1) * N
    for c in gl.static_range(CONSUMERS):
        mbarrier.expect(q_bar.index(c), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row0 + c * BM, 0], q_bar.index(c), q_smem.index(c))
    for j in range(N // BN):
        slot = j % STAGES
        mbarrier.wait(kv_empty.index(slot), (j // STAGES) & 1)
        # keys and values on barriers of their own: the scores need not wait for the values
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [key0 + j * BN, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [key0 + j * BN, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _compute_partition(o, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, turn, ROWS, N, qk_scale,
                       WG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    """One warpgroup's ``BM`` rows (``BM`` from ``q_smem``) over every key tile; see the module's
    docstring for the order of a step."""
    BM: gl.constexpr = q_smem.shape[1]
    DH: gl.constexpr = q_smem.shape[2]
    n_tiles = N // BN
    row0 = gl.program_id(1) * ROWS + gl.program_id(0) * (CONSUMERS * BM) + WG * BM
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DH, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    OTHER: gl.constexpr = 1 - WG

    q = q_smem.index(WG)
    mbarrier.wait(q_bar.index(WG), 0)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BM], gl.float32, layout=row_s)
    acc = gl.zeros([BM, DH], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)

    # step 0: tile 0's scores alone
    mbarrier.wait(k_ready.index(0), 0)
    if PINGPONG:
        mbarrier.wait(turn.index(WG), 0)
    s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(OTHER))
    s = warpgroup_mma_wait(0, deps=(s_tok, ))
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row_o)
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    for j in range(1, n_tiles):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(turn.index(WG), j & 1)
        s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(OTHER))
        s, acc = warpgroup_mma_wait(0, deps=(s_tok, acc))
        mbarrier.arrive(kv_empty.index(prev))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row_o)
        acc = acc * gl.expand_dims(alpha, 1)
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    if PINGPONG:
        mbarrier.wait(turn.index(WG), n_tiles & 1)
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(OTHER))
    acc = warpgroup_mma_wait(0, deps=(acc, ))

    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    o_r = row0 + gl.arange(0, BM, layout=row_o)
    o_c = gl.arange(0, DH, layout=gl.SliceLayout(0, o_layout))
    gl.store(o + gl.expand_dims(o_r.to(gl.int64) * DH, 1) + gl.expand_dims(o_c, 0), out.to(gl.bfloat16))


@gluon.jit
def attn_fwd_ws_kernel(q_desc, k_desc, v_desc, o, ROWS, N, qk_scale, STAGES: gl.constexpr,
                       PINGPONG: gl.constexpr, COMPUTE_REGS: gl.constexpr):
    """Grid ``(ROWS // (2 * BM), GROUPS)``, ``BM`` and ``BN`` the descriptors' tile rows; ``N`` a
    multiple of ``BN``. ``num_warps`` must be 4 (the default partition is one computing warpgroup)."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    DH: gl.constexpr = q_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BM, DH], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, DH], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, DH], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CONSUMERS):
        mbarrier.init(q_bar.index(c), count=1)
        mbarrier.init(turn.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)
    fence_async_shared()
    # every slot starts released, and warpgroup 0 starts with the turn
    for i in gl.static_range(STAGES):
        mbarrier.arrive(kv_empty.index(i), count=CONSUMERS)
    mbarrier.arrive(turn.index(0))

    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    gl.warp_specialize([
        (_compute_partition, (o, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, turn, ROWS, N, qk_scale,
                              WG0, BN, STAGES, PINGPONG)),
        (_compute_partition, (o, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, turn, ROWS, N, qk_scale,
                              WG1, BN, STAGES, PINGPONG)),
        (_copy_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, kv_empty, ROWS, N,
                           STAGES)),
    ], [4, 1], [COMPUTE_REGS, 24])


def run(q, k, v, rows: int, n: int, bm: int, bn: int, stages: int, pingpong: bool, regs: int):
    o = torch.full_like(q, float("nan"))
    qd, kd, vd = _descriptors(q, k, v, bm, bn)
    scale = D ** -0.5 * LOG2E

    def call():
        attn_fwd_ws_kernel[(rows // (CONSUMERS.value * bm), GROUPS)](qd, kd, vd, o, rows, n, scale, STAGES=stages,
                                                                PINGPONG=pingpong, COMPUTE_REGS=regs, num_warps=4,
                                                                maxnreg=168)
    return o, call


#: (rows a warpgroup, keys a tile, stages, ping-pong, the computing warpgroups' registers)
CONFIGS = [(bm, bn, stages, pingpong, 240)
           for (bm, bn), stages, pingpong in itertools.product(((64, 128), (128, 64)), (2, 3), (False, True))]
#: session 60's best plain Gluon loop (a gpu_gluon_probe.CONFIGS entry) and Triton's best loop (a
#: gpu_gluon_probe.TRITON_CONFIGS entry), timed in the same process for comparison
BASELINES = [("gluon", (128, 64, 4, 2, False)), ("triton", ("desc", 128, 64, 4, 2))]


def compile_only() -> None:
    """Each configuration compiled for sm_90 (no GPU): registers, spills, shared memory, ptxas's notes."""
    for bm, bn, stages, pingpong, regs in CONFIGS:
        values = dict(STAGES=stages, PINGPONG=pingpong, COMPUTE_REGS=regs)
        compile_report(attn_fwd_ws_kernel, forward_signature(bm, bn, list(values)), values,
                       f"BM={bm} BN={bn} stages={stages} pingpong={pingpong} regs={regs}", num_warps=4, maxnreg=168)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=262144, help="rows per group (multiple of 256)")
    ap.add_argument("--keys", type=int, default=2048, help="keys per group (multiple of 128)")
    args = parse_run_arguments(ap, "CONFIGS (default all), then BASELINES as len(CONFIGS) + i", compile_only)
    if args is None:
        return
    import gpu_gluon_probe
    import gpu_ws_probe

    small, want, big, flops = gpu_gluon_probe.problem(args.rows, args.keys, seed=61)
    measure = lambda name, make: gpu_gluon_probe.measure(name, make, small, want, big, flops)
    chosen = args.configs if args.configs is not None else range(len(CONFIGS) + len(BASELINES))
    for i in chosen:
        if i < len(CONFIGS):
            bm, bn, stages, pingpong, regs = CONFIGS[i]
            measure(f"ws    BM=2x{bm:3d} BN={bn:3d} stages={stages} pingpong={pingpong!s:5} regs={regs}",
                    lambda q_, k_, v_, r, n: run(q_, k_, v_, r, n, bm, bn, stages, pingpong, regs))
        elif BASELINES[i - len(CONFIGS)][0] == "gluon":
            bm, bn, warps, stages, overlap = BASELINES[i - len(CONFIGS)][1]
            measure(f"gluon BM={bm:3d} BN={bn:3d} warps={warps} stages={stages} (plain loop)",
                    lambda q_, k_, v_, r, n: gpu_gluon_probe.run(q_, k_, v_, r, n, bm, bn, warps, stages, overlap))
        else:
            triton.set_allocator(gpu_ws_probe._alloc)
            kind, bm, bn, warps, stages = BASELINES[i - len(CONFIGS)][1]
            measure(f"triton {kind} BM={bm:3d} BN={bn:3d} warps={warps} stages={stages}",
                    lambda q_, k_, v_, r, n: gpu_ws_probe.run(kind, q_, k_, v_, r, n, bm, bn, warps, stages))


if __name__ == "__main__":
    main()
