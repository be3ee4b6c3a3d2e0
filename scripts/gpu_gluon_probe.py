"""How fast can an attention loop run on Hopper when its wgmma and softmax overlap? A Gluon probe,
no library code.

Why: the library's attention kernels are Triton, whose Hopper pipeliner issues a tile's score
product and waits for it at once, so that the exponentials of a tile never overlap a product
(session 56 read the TTGIR; session 59's warp-specialisation probe found Triton's own
specialisation slower). Their loops run at 50-80 % of cuDNN's dense rate; the best plain Triton
loop of the compressed forward's shape reached 511 TFLOP/s (session 59). Gluon, Triton's
lower-level language (``triton.experimental.gluon``, in Triton 3.6), exposes the wgmma's
asynchronous issue and wait, TMA copies and mbarriers directly, so a kernel can order them as the
hand-written Hopper kernels do.

The kernel ``attn_fwd_gluon_kernel`` has the shape of ``scripts/gpu_ws_probe.py``'s loop, so that
their TFLOP/s compare: rows are ``BM`` (query position, head) pairs of one KV group, keys a shared
``[N, 128]`` stream of that group, bf16 in, float32 softmax (log2 domain), one output tile per
program; K and V tiles come by TMA into a ring of ``STAGES`` buffers, each with its mbarrier.

- ``OVERLAP=False``: Triton's order. Each tile's score product is issued and waited for; the
  exponentials follow; the tile's ``P V`` product is issued and waited for with the next score.
- ``OVERLAP=True``: the next tile's score product is issued before this tile's exponentials, so
  that the tensor cores compute it (after the previous tile's ``P V``) meanwhile; then both are
  waited for, the accumulator rescaled and this tile's ``P V`` issued, to run beside the next
  tile's exponentials. (Waiting for the ``P V`` alone, one product left in flight, made ptxas
  serialise the kernel's wgmma, note C7514.)

Usage: ``python scripts/gpu_gluon_probe.py [--rows 262144] [--keys 2048]`` (needs a Hopper GPU):
each configuration checked against torch (float32) on a small problem, then timed (``do_bench``
median, L2 flushed). ``--compile-only`` compiles each configuration for sm_90 without a GPU and
prints its registers, spills and ptxas notes.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from typing import Optional

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma_init

D = 128  # as scripts/gpu_ws_probe.py's
GROUPS = 4
LOG2E = 1.4426950408889634


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, tile, key0, BN: gl.constexpr, STAGES: gl.constexpr):
    """TMA copies of key/value tile ``tile`` into its ring slot, counted on the slot's barrier."""
    slot = tile % STAGES
    bar = kv_bar.index(slot)
    mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [key0 + tile * BN, 0], bar, k_smem.index(slot))
    tma.async_copy_global_to_shared(v_desc, [key0 + tile * BN, 0], bar, v_smem.index(slot))


@gluon.jit
def _softmax(s, m_i, l_i, qk_scale, row_o: gl.constexpr):
    """One tile's online softmax on raw scores ``s``: ``(p, alpha in row_o, m, l)``."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, gl.convert_layout(alpha, row_o), m_new, l_i


@gluon.jit
def attn_fwd_gluon_kernel(q_desc, k_desc, v_desc, o, ROWS, N, qk_scale,
                          BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                          num_warps: gl.constexpr):
    """Grid ``(ROWS // BM, GROUPS)``: ``o`` rows ``[g * ROWS + i * BM, +BM)`` attend to keys
    ``[g * N, (g + 1) * N)``; ``N`` a multiple of ``BN``, at least ``STAGES`` tiles."""
    DH: gl.constexpr = q_desc.block_type.shape[1]
    i_m = gl.program_id(0)
    i_g = gl.program_id(1)
    row0 = i_g * ROWS + i_m * BM
    key0 = i_g * N
    n_tiles = N // BN

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, DH, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BM, DH], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, DH], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, DH], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kv_bar.index(i), count=1)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES - 1):
        _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, i, key0, BN, STAGES)
    mbarrier.wait(q_bar, 0)

    m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BM], gl.float32, layout=row_s)
    acc = warpgroup_mma_init(gl.zeros([BM, DH], gl.float32, layout=o_layout))
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)

    if OVERLAP:
        # tile j + 1 is waited for at the top of iteration j, and its copy was issued in iteration
        # j + 2 - STAGES: with two slots it would never have been issued (session 60's first GPU
        # call hung there)
        gl.static_assert(STAGES >= 3, "the overlapped loop needs three slots or more")
        mbarrier.wait(kv_bar.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok, ))
        for j in range(n_tiles - 1):
            # the next tile's scores go to the tensor cores before this tile's exponentials
            nxt = (j + 1) % STAGES
            mbarrier.wait(kv_bar.index(nxt), ((j + 1) // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row_o)
            # the previous P V and the next scores ran on the tensor cores meanwhile
            acc, s = warpgroup_mma_wait(0, deps=(acc, s_tok))
            # the slot of tile j - 1 is free (its scores and its P V are done): refill it
            if j + STAGES - 1 < n_tiles:
                _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, j + STAGES - 1, key0, BN, STAGES)
            acc = acc * gl.expand_dims(alpha, 1)
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            acc = warpgroup_mma(p_op, v_smem.index(j % STAGES), acc, is_async=True)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row_o)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        acc = acc * gl.expand_dims(alpha, 1)
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        acc = warpgroup_mma(p_op, v_smem.index((n_tiles - 1) % STAGES), acc, is_async=True)
    else:
        for j in range(n_tiles):
            slot = j % STAGES
            mbarrier.wait(kv_bar.index(slot), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s, acc = warpgroup_mma_wait(0, deps=(s_tok, acc))
            # every product of tile j - 1 is done: refill its slot
            if j + STAGES - 1 < n_tiles:
                _load_kv(k_desc, v_desc, k_smem, v_smem, kv_bar, j + STAGES - 1, key0, BN, STAGES)
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, qk_scale, row_o)
            acc = acc * gl.expand_dims(alpha, 1)
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            acc = warpgroup_mma(p_op, v_smem.index(slot), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bar.index(i))

    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    o_r = row0 + gl.arange(0, BM, layout=row_o)
    o_c = gl.arange(0, DH, layout=gl.SliceLayout(0, o_layout))
    ptrs = o + gl.expand_dims(o_r.to(gl.int64) * DH, 1) + gl.expand_dims(o_c, 0)
    gl.store(ptrs, out.to(gl.bfloat16))


def _descriptors(q, k, v, bm: int, bn: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    q_layout = gl.NVMMASharedLayout.get_default_for([bm, D], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, D], gl.bfloat16)
    return (TensorDescriptor(q, list(q.shape), list(q.stride()), [bm, D], q_layout),
            TensorDescriptor(k, list(k.shape), list(k.stride()), [bn, D], kv_layout),
            TensorDescriptor(v, list(v.shape), list(v.stride()), [bn, D], kv_layout))


def run(q, k, v, rows: int, n: int, bm: int, bn: int, warps: int, stages: int, overlap: bool):
    o = torch.full_like(q, float("nan"))
    qd, kd, vd = _descriptors(q, k, v, bm, bn)
    scale = D ** -0.5 * LOG2E

    def call():
        attn_fwd_gluon_kernel[(rows // bm, GROUPS)](qd, kd, vd, o, rows, n, scale, BM=bm, BN=bn, STAGES=stages,
                                                    OVERLAP=overlap, num_warps=warps)
    return o, call


CONFIGS = [(bm, bn, warps, stages, overlap)
           for (bm, warps), bn, stages, overlap in itertools.product(((64, 4), (128, 8)), (64, 128), (2, 3),
                                                                      (False, True))
           if stages >= 3 or not overlap]
CONFIGS += [(128, 64, 4, stages, False) for stages in (2, 3)]  # Triton's best loop's tile (no room to overlap)
#: The same problem's Triton loops (scripts/gpu_ws_probe.py), timed in the same process for comparison:
#: (loads, rows, keys a tile, warps, stages).
TRITON_CONFIGS = [("desc", 128, 64, 4, 2), ("ptr", 128, 64, 4, 2), ("desc", 64, 64, 4, 3)]


def descriptor(block: list, layout) -> str:
    """The signature type of a host-built bf16 tensor descriptor of ``block`` in shared ``layout``."""
    return f"tensordesc<bf16[{', '.join(map(str, block))}],{layout!r}>"


def forward_signature(bm: int, bn: int, constexprs: list) -> dict:
    """The forward probes' kernel signature: ``q`` in ``bm``-row tiles, ``k``/``v`` in ``bn``-row
    tiles, the output, the sizes, the scale, then the constexprs named in ``constexprs``."""
    q_layout = gl.NVMMASharedLayout.get_default_for([bm, D], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, D], gl.bfloat16)
    return {"q_desc": descriptor([bm, D], q_layout), "k_desc": descriptor([bn, D], kv_layout),
            "v_desc": descriptor([bn, D], kv_layout), "o": "*bf16", "ROWS": "i32", "N": "i32", "qk_scale": "fp32",
            **{name: "constexpr" for name in constexprs}}


def parse_run_arguments(parser: argparse.ArgumentParser, configs: str, compile_only) -> Optional[argparse.Namespace]:
    """The Gluon probes' ``--compile-only`` and ``--configs`` (``configs``: what the indices name)
    added to ``parser``, then the command line parsed: with ``--compile-only`` ``compile_only()``
    runs and None comes back, else the arguments."""
    parser.add_argument("--compile-only", action="store_true", help="compile for sm_90 without a GPU")
    parser.add_argument("--configs", type=int, nargs="+", help=f"indices into {configs}; run each in a process of "
                        "its own under a timeout, as a hung kernel holds the GPU")
    args = parser.parse_args()
    if args.compile_only:
        compile_only()
        return None
    return args


def compile_report(kernel, signature: dict, values: dict, name: str, **options) -> None:
    """Compile the Gluon ``kernel`` for sm_90 without a GPU (``signature`` its parameters' types in
    order, ``"constexpr"`` for those whose value ``values`` gives by name; ``options`` such as
    ``num_warps`` and ``maxnreg``) and print one line: registers at launch (and the partitions'
    ``setmaxnreg`` values, if warp-specialised), spills, shared memory and ptxas's notes; a failure
    is printed, not raised. The session-60 and session-61 probes' ``--compile-only``."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    import gpu_ptxas_notes  # scripts/ on the path

    constexprs = {(list(signature).index(key),): value for key, value in values.items()}
    try:
        compiled = triton.compile(GluonASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                  options=options)
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(compiled.asm["ptx"])
            f.flush()
            regs, spills, notes = gpu_ptxas_notes.ptxas_report(f.name)
        setmaxnreg = sorted({int(line.split()[1].rstrip(";")) for line in compiled.asm["ptx"].splitlines()
                             if line.strip().startswith("setmaxnreg")})
        print(f"{name}: {regs} registers at launch{f' (setmaxnreg {setmaxnreg})' if setmaxnreg else ''}, {spills}, "
              f"shared {compiled.metadata.shared} B, notes {[code for code, _ in notes] or 'none'}", flush=True)
    except Exception as exc:
        print(f"{name}: failed: {type(exc).__name__}: {str(exc)[-1500:]}", flush=True)


def compile_only() -> None:
    """Each configuration compiled for sm_90 (no GPU): registers, spills, ptxas's notes."""
    for bm, bn, warps, stages, overlap in CONFIGS:
        values = dict(BM=bm, BN=bn, STAGES=stages, OVERLAP=overlap, num_warps=warps)
        compile_report(attn_fwd_gluon_kernel, forward_signature(bm, bn, list(values)), values,
                       f"BM={bm} BN={bn} warps={warps} stages={stages} overlap={overlap}", num_warps=warps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=262144, help="rows per group (multiple of 128)")
    ap.add_argument("--keys", type=int, default=2048, help="keys per group (multiple of 128)")
    args = parse_run_arguments(ap, "CONFIGS (default all), then TRITON_CONFIGS as len(CONFIGS) + i", compile_only)
    if args is None:
        return
    import gpu_ws_probe  # the same problem's Triton loops and reference (scripts/ on the path)

    small, want, big, flops = problem(args.rows, args.keys, seed=60)
    chosen = args.configs if args.configs is not None else range(len(CONFIGS) + len(TRITON_CONFIGS))
    for bm, bn, warps, stages, overlap in (CONFIGS[i] for i in chosen if i < len(CONFIGS)):
        measure(f"gluon BM={bm:3d} BN={bn:3d} warps={warps} stages={stages} overlap={overlap!s:5}",
                lambda q, k, v, r, n: run(q, k, v, r, n, bm, bn, warps, stages, overlap), small, want, big, flops)
    triton.set_allocator(gpu_ws_probe._alloc)
    for kind, bm, bn, warps, stages in (TRITON_CONFIGS[i - len(CONFIGS)] for i in chosen if i >= len(CONFIGS)):
        measure(f"triton {kind:4s} BM={bm:3d} BN={bn:3d} warps={warps} stages={stages}",
                lambda q, k, v, r, n: gpu_ws_probe.run(kind, q, k, v, r, n, bm, bn, warps, stages), small, want, big,
                flops)


def problem(rows: int, keys: int, seed: int, small_rows: int = 1024, small_keys: int = 512):
    """The forward probes' problem (this one's and ``gpu_gluon_ws_probe.py``'s): ``(small, want, big,
    flops)``, ``small`` and ``big`` each ``(q, k, v, rows, keys)`` in bf16 over ``GROUPS`` groups,
    ``want`` the small problem's float32 output (``gpu_ws_probe.reference``), ``flops`` the big one's
    useful work; the device and versions printed first."""
    import gpu_ws_probe

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{GROUPS} groups x {rows} rows x {keys} keys, head dim {D}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tensors = lambda r, n: tuple(torch.randn(GROUPS * m, D, device="cuda", generator=gen).bfloat16() for m in (r, n, n))
    small = (*tensors(small_rows, small_keys), small_rows, small_keys)
    big = (*tensors(rows, keys), rows, keys)
    return small, gpu_ws_probe.reference(*small), big, 4.0 * GROUPS * rows * keys * D


def measure(name: str, make, small: tuple, want: torch.Tensor, big: tuple, flops: float, rep: int = 300) -> None:
    """One configuration: ``make(q, k, v, rows, keys)`` gives ``(output, call)``; checked on ``small``
    against ``want`` (output NaN-poisoned first), timed on ``big`` (``do_bench`` median, L2 flushed),
    one line printed; a configuration that does not compile or fit is reported, not fatal."""
    try:
        out, call = make(*small)
        out.fill_(float("nan"))
        call()
        err = (out.float() - want).abs().max().item()
        _, call = make(*big)
        ms = triton.testing.do_bench(call, warmup=10, rep=rep, return_mode="median")
        print(f"{name}: {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  max error {err:.2e}", flush=True)
    except Exception as exc:
        print(f"{name}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)


if __name__ == "__main__":
    main()
