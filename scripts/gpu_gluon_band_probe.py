"""Does a persistent warp-specialised loop win back the window kernels' fixed cost? A probe, no
library code.

Why: the window kernels attend each query tile to a short band of keys (the paper's 512-token
window: about 9 tiles of 64), and session 60 found them losing about a fifth of their time to each
program's fixed part: long bands run at 380-409 TFLOP/s, the 512-token band at 295. Together they
take about 19 ms of the 64k forward+backward's 93. A program that walks several query tiles (one per
SM or two, persistent) with a copy warp that fetches the next tile's queries and keys while the
computing warpgroups finish the current one overlaps that fixed part with work; the session-61
warp-specialised loop (``scripts/gpu_gluon_ws_probe.py``) is the starting point.

The problem has the window's shape without its masks: per KV group (4), rows are ``(position,
head)`` pairs (16 heads a position), keys a ``[positions + BAND, 128]`` stream; the query tile of
rows ``[r, r + BM)`` attends to keys ``[r // 16, r // 16 + BAND)`` (every band full, no causal edge),
bf16 in, float32 softmax in the log2 domain.

- ``triton``: the plain loop (``gpu_ws_probe._softmax_step``) over descriptor loads, one query tile
  a program, at the window forward's tiles (64 rows, 4 warps, 2 stages) and at 128 rows.
- ``gluon``: one copy warp and two computing warpgroups of 64 rows (a 128-row query tile a step of
  the program), the key/value ring shared by both and running on across query tiles; the queries
  double-buffered, so the copy warp loads the next tile's while the current one is computed. With a
  grid of one program a tile this is the session-61 loop on a band; with ``PROGRAMS`` programs (a
  multiple of the SMs) each walks every ``PROGRAMS``-th tile: persistent.

Usage: ``python scripts/gpu_gluon_band_probe.py [--rows 262144] [--band 512] [--configs I ...]``
(Hopper GPU): each configuration checked against torch (float32) on a small problem, then timed
(``do_bench`` median, L2 flushed; ``gpu_gluon_probe.measure``); TFLOP/s of useful work,
``4 * rows * band * 128`` a group.
``--compile-only`` compiles the Gluon configurations for sm_90 without a GPU.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from gpu_gluon_probe import (D, GROUPS, LOG2E, _softmax, compile_report, descriptor, measure,  # scripts/
                             parse_run_arguments)
from gpu_ws_probe import _softmax_step  # scripts/
from nsa.ops._gluon import tma_load  # the TMA load by its name in the installed Triton

#: Computing warpgroups a Gluon program, 64 rows each.
CONSUMERS = gl.constexpr(2)
#: Heads a position: a tile's band starts at its first row // HEADS.
HEADS = 16
#: GROUPS as the jit functions may read it
N_GROUPS = gl.constexpr(GROUPS)


@triton.jit
def band_triton_kernel(q_desc, k_desc, v_desc, o, ROWS, KEYS, BAND, qk_scale, BM: tl.constexpr, BN: tl.constexpr,
                       STAGES: tl.constexpr):
    """Grid ``(ROWS // BM, GROUPS)``: one query tile over its band."""
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    row0 = i_m * BM
    key0 = i_g * KEYS + row0 // 16
    b_q = q_desc.load([i_g * ROWS + row0, 0])
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_acc = tl.zeros([BM, 128], tl.float32)
    for j in tl.range(0, BAND // BN, num_stages=STAGES):
        b_k = k_desc.load([key0 + j * BN, 0])
        b_v = v_desc.load([key0 + j * BN, 0])
        b_m, b_l, b_acc = _softmax_step(b_q, b_k, b_v, b_m, b_l, b_acc, qk_scale)
    o_r = i_g * ROWS + row0 + tl.arange(0, BM)
    tl.store(o + (o_r.to(tl.int64) * 128)[:, None] + tl.arange(0, 128)[None, :], (b_acc / b_l[:, None]).to(tl.bfloat16))


@gluon.jit
def _copy_partition(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty,
                    ROWS, KEYS, BAND, STAGES: gl.constexpr):
    """One warp: each of the program's query tiles' two row halves into a free query buffer (two
    buffers, each released by both warpgroups), then the tile's band of keys and values into the
    ring (a slot released by both warpgroups), the ring's count running on across tiles."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    tiles = ROWS // (CONSUMERS * BM)
    j = 0
    t = 0
    for tile in range(gl.program_id(0), tiles * N_GROUPS, gl.num_programs(0)):
        i_g = tile // tiles
        row0 = (tile % tiles) * (CONSUMERS * BM)
        buf = t % 2
        mbarrier.wait(q_empty.index(buf), (t // 2) & 1)
        for c in gl.static_range(CONSUMERS):
            bar = q_ready.index(buf * CONSUMERS + c)
            mbarrier.expect(bar, q_desc.block_type.nbytes)
            tma_load(q_desc, [i_g * ROWS + row0 + c * BM, 0], bar, q_smem.index(buf * CONSUMERS + c))
        key0 = i_g * KEYS + row0 // 16
        for n in range(BAND // BN):
            slot = j % STAGES
            mbarrier.wait(kv_empty.index(slot), (j // STAGES) & 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            tma_load(k_desc, [key0 + n * BN, 0], k_ready.index(slot), k_smem.index(slot))
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma_load(v_desc, [key0 + n * BN, 0], v_ready.index(slot), v_smem.index(slot))
            j += 1
        t += 1


@gluon.jit
def _compute_partition(o, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, ROWS, KEYS, BAND,
                       qk_scale, WG: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    """Warpgroup ``WG``'s 64 rows of each of the program's query tiles over the tile's band: a step
    issues this key tile's scores and the previous one's ``P V``, waits for both, releases the
    previous slot; the last ``P V`` done, the query buffer is released before the output is
    written, so that the copy warp's next loads overlap the store."""
    BM: gl.constexpr = q_smem.shape[1]
    DH: gl.constexpr = q_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DH, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    tiles = ROWS // (CONSUMERS * BM)
    n_kv = BAND // BN
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    j = 0
    t = 0
    for tile in range(gl.program_id(0), tiles * N_GROUPS, gl.num_programs(0)):
        i_g = tile // tiles
        row0 = i_g * ROWS + (tile % tiles) * (CONSUMERS * BM) + WG * BM
        buf = t % 2
        q = q_smem.index(buf * CONSUMERS + WG)
        mbarrier.wait(q_ready.index(buf * CONSUMERS + WG), (t // 2) & 1)
        m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BM], gl.float32, layout=row_s)
        acc = gl.zeros([BM, DH], gl.float32, layout=o_layout)
        slot = j % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok, ))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row_o)
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        for n in range(1, n_kv):
            slot = (j + n) % STAGES
            prev = (j + n - 1) % STAGES
            mbarrier.wait(k_ready.index(slot), ((j + n) // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((j + n - 1) // STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s, acc = warpgroup_mma_wait(0, deps=(s_tok, acc))
            mbarrier.arrive(kv_empty.index(prev))
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row_o)
            acc = acc * gl.expand_dims(alpha, 1)
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        last = (j + n_kv - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((j + n_kv - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(kv_empty.index(last))
        mbarrier.arrive(q_empty.index(buf))
        out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
        o_r = row0 + gl.arange(0, BM, layout=row_o)
        o_c = gl.arange(0, DH, layout=gl.SliceLayout(0, o_layout))
        gl.store(o + gl.expand_dims(o_r.to(gl.int64) * DH, 1) + gl.expand_dims(o_c, 0), out.to(gl.bfloat16))
        j += n_kv
        t += 1


@gluon.jit
def band_gluon_kernel(q_desc, k_desc, v_desc, o, ROWS, KEYS, BAND, qk_scale, STAGES: gl.constexpr,
                      COMPUTE_REGS: gl.constexpr):
    """Grid ``(programs,)``: program ``p`` takes query tiles ``p, p + programs, ...`` of the
    ``GROUPS * ROWS // (2 * BM)``; ``num_warps`` 4 (the default partition is warpgroup 0)."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    DH: gl.constexpr = q_desc.block_type.shape[1]
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * CONSUMERS, BM, DH], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, DH], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, DH], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2 * CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * CONSUMERS):
        mbarrier.init(q_ready.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(q_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)
    fence_async_shared()
    # every query buffer and ring slot starts released by both warpgroups
    for i in gl.static_range(2):
        mbarrier.arrive(q_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(STAGES):
        mbarrier.arrive(kv_empty.index(i), count=CONSUMERS)
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    gl.warp_specialize([
        (_compute_partition, (o, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, ROWS, KEYS,
                              BAND, qk_scale, WG0, BN, STAGES)),
        (_compute_partition, (o, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, kv_empty, ROWS, KEYS,
                              BAND, qk_scale, WG1, BN, STAGES)),
        (_copy_partition, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready,
                           kv_empty, ROWS, KEYS, BAND, STAGES)),
    ], [4, 1], [COMPUTE_REGS, 24])


def _layouts(bm: int, bn: int):
    return (gl.NVMMASharedLayout.get_default_for([bm, D], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([bn, D], gl.bfloat16))


def run(kind: str, ins, rows: int, keys: int, band: int, bm: int, bn: int, stages: int, programs: int):
    """``(o, call)`` for one configuration (``measure`` poisons ``o``). ``programs`` 0: one a query tile."""
    q, k, v = ins
    o = torch.empty_like(q)
    scale = D ** -0.5 * LOG2E
    if kind == "triton":
        from triton.tools.tensor_descriptor import TensorDescriptor

        import gpu_ws_probe

        triton.set_allocator(gpu_ws_probe._alloc)
        qd = TensorDescriptor(q, list(q.shape), list(q.stride()), [bm, D])
        kd, vd = (TensorDescriptor(t, list(t.shape), list(t.stride()), [bn, D]) for t in (k, v))
        warps = 4 if bm == 64 else 8

        def call():
            band_triton_kernel[(rows // bm, GROUPS)](qd, kd, vd, o, rows, keys, band, scale, BM=bm, BN=bn,
                                                     STAGES=stages, num_warps=warps)
        return o, call
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    q_layout, kv_layout = _layouts(bm, bn)
    qd = TensorDescriptor(q, list(q.shape), list(q.stride()), [bm, D], q_layout)
    kd, vd = (TensorDescriptor(t, list(t.shape), list(t.stride()), [bn, D], kv_layout) for t in (k, v))
    tiles = GROUPS * rows // (2 * bm)
    grid = (min(programs, tiles) if programs else tiles, )

    def call():
        band_gluon_kernel[grid](qd, kd, vd, o, rows, keys, band, scale, STAGES=stages, COMPUTE_REGS=240, num_warps=4,
                                maxnreg=168)
    return o, call


#: (kind, rows a tile (Triton) or a warpgroup (Gluon), keys a tile, stages, programs: 0 one a query
#: tile, else SMs times this)
CONFIGS = [("triton", 64, 64, 2, 0), ("triton", 128, 64, 2, 0)]
CONFIGS += [("gluon", 64, bn, stages, 0) for bn, stages in ((64, 3), (128, 2))]
CONFIGS += [("gluon", 64, bn, stages, per_sm) for bn, stages in ((64, 3), (128, 2)) for per_sm in (1, 2)]


def make_inputs(rows: int, band: int, gen: torch.Generator):
    keys = rows // HEADS + band
    q = torch.randn(GROUPS * rows, D, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(GROUPS * keys, D, device="cuda", generator=gen).bfloat16() for _ in range(2))
    return (q, k, v), keys


def reference(q, k, v, rows: int, keys: int, band: int, tile: int) -> torch.Tensor:
    """float32 outputs, each ``tile``-row query tile (the kernel's own) over its band of keys."""
    out = torch.empty(GROUPS * rows, D, device="cuda")
    scale = D ** -0.5
    for g in range(GROUPS):
        for r0 in range(0, rows, tile):
            k0 = g * keys + r0 // HEADS
            s = q[g * rows + r0:g * rows + r0 + tile].float() @ k[k0:k0 + band].float().T * scale
            out[g * rows + r0:g * rows + r0 + tile] = torch.softmax(s, -1) @ v[k0:k0 + band].float()
    return out


def compile_only() -> None:
    """The Gluon configurations compiled for sm_90 (no GPU): registers, spills, shared memory, notes."""
    for bm, bn, stages in sorted({(bm, bn, stages) for kind, bm, bn, stages, _ in CONFIGS if kind == "gluon"}):
        q_layout, kv_layout = _layouts(bm, bn)
        values = dict(STAGES=stages, COMPUTE_REGS=240)
        sig = {"q_desc": descriptor([bm, D], q_layout), "k_desc": descriptor([bn, D], kv_layout),
               "v_desc": descriptor([bn, D], kv_layout), "o": "*bf16", "ROWS": "i32", "KEYS": "i32", "BAND": "i32",
               "qk_scale": "fp32", **{key: "constexpr" for key in values}}
        compile_report(band_gluon_kernel, sig, values, f"gluon BM=2x{bm} BN={bn} stages={stages}", num_warps=4,
                       maxnreg=168)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=262144, help="rows per group (multiple of 128)")
    ap.add_argument("--band", type=int, default=512, help="keys a query tile attends to (multiple of 128)")
    args = parse_run_arguments(ap, "CONFIGS (default all)", compile_only)
    if args is None:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{GROUPS} groups x {args.rows} rows, bands of {args.band} keys, head dim {D}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(62)
    small_rows = 2048
    small, small_keys = make_inputs(small_rows, args.band, gen)
    big, big_keys = make_inputs(args.rows, args.band, gen)
    flops = 4.0 * GROUPS * args.rows * args.band * D
    wants = {}  # the small problem's float32 output by query tile
    for i in args.configs if args.configs is not None else range(len(CONFIGS)):
        kind, bm, bn, stages, per_sm = CONFIGS[i]
        name = f"{kind:6s} BM={'2x' if kind == 'gluon' else ''}{bm} BN={bn} stages={stages} " + (
            f"persistent, {per_sm} a SM" if per_sm else "one program a tile")
        tile = 2 * bm if kind == "gluon" else bm
        if tile not in wants:
            wants[tile] = reference(*small, small_rows, small_keys, args.band, tile)
        # the check's persistent programs (8 or 16) walk 8 or 4 of the small problem's 64 query
        # tiles each: at one or two an SM each would take one
        make = lambda q, k, v, rows, keys: run(kind, (q, k, v), rows, keys, args.band, bm, bn, stages,
                                               (8 if rows == small_rows else sms) * per_sm)
        measure(name, make, (*small, small_rows, small_keys), wants[tile], (*big, args.rows, big_keys), flops)


if __name__ == "__main__":
    main()
