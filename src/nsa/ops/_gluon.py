"""What the Gluon kernels (Hopper, warp-specialised) share: Gluon's imports where the installed
Triton has them, the TMA copies by their name in that release, the barriers of a copy warp's ring of
slots (:func:`ring_barriers`, :func:`fill_key_slot`) and of a persistent program's items
(:func:`released_barrier`, :func:`head_item`, :func:`head_items_grid`), the launch of two computing
warpgroups and a copy warp (:data:`PAIR_LAUNCH`), a gradient's store (:func:`store_scaled`), a warpgroup's wgmma register layouts
(:func:`wgmma_layout`, :func:`a_operand_layout`), the compressed tokens a position sees
(:func:`visible_compressed`), the TMA copies' layouts and descriptors over the library's tensors, a
partition's thread barrier and cp.async gathers (:data:`thread_barrier`, :data:`gather_async`) by
their name in the installed release, compiling a kernel for sm_90 without a GPU, and the error a
failed launch raises.

Gluon is Triton's lower-level language, experimental in Triton 3.6, and its API moves between
releases (3.9 renamed the TMA copies and made the old names raise). The kernels import it from here,
so that one place follows those moves. Gluon has no CPU interpreter: each kernel's CPU test compiles
it for sm_90 (:func:`compile_for_sm90`), its GPU tests compare it with the Triton kernel it replaces.
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence

import torch
from triton.runtime.jit import constexpr_function

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Triton 3.9 renamed the TMA copies (the old names raise); 3.6 has only the old ones
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    # a barrier of the threads of a program (of a partition, inside warp_specialize): 3.7 renamed it
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    # a gather of 4-16 bytes a thread into shared memory (cp.async): 3.8 renamed it
    gather_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
except ImportError:  # pragma: no cover - an older Triton
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    TensorDescriptor = tma_load = tma_store = thread_barrier = async_copy = gather_async = None

__all__ = ["gluon", "gl", "fence_async_shared", "mbarrier", "tma", "warpgroup_mma", "warpgroup_mma_wait",
           "TensorDescriptor", "tma_load", "tma_store", "thread_barrier", "async_copy",
           "gather_async", "on_hopper", "element_type", "descriptor_type",
           "copies_fit", "copy_layouts", "head_rows_descriptor", "key_rows_descriptor", "launch_descriptors",
           "descriptor_signature", "head_items_grid",
           "compile_for_sm90",
           "launch_failed", "ring_barriers", "fill_key_slot", "released_barrier", "head_item", "store_scaled",
           "visible_compressed",
           "wgmma_layout", "a_operand_layout", "PAIR_LAUNCH"]


#: The launch of a kernel of two computing warpgroups and a copy warp (all but the selected dK/dV's):
#: the default partition is warpgroup 0 (4 warps); from a launch at 168 registers a thread, the
#: kernel's ``warp_specialize(..., [4, 1], [240, 24])`` gives the computing warpgroups 240, the copy
#: warp 24. The kernels import it as their ``LAUNCH_OPTIONS``, the name every launch site passes
#: (``tests/ops/test_launch_options.py``).
PAIR_LAUNCH = dict(num_warps=4, maxnreg=168)


@constexpr_function
def wgmma_layout(n: int):
    """The register layout of a computing warpgroup's ``[64, n]`` wgmma accumulator (called in a
    kernel on a constexpr width)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@constexpr_function
def a_operand_layout(acc_layout):
    """The register layout of a 16-bit A operand of a wgmma product into an ``acc_layout`` accumulator."""
    return gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)


def on_hopper(t: torch.Tensor) -> bool:
    """Whether Gluon imports and ``t`` lives on a Hopper GPU (compute capability 9), where the
    Gluon kernels' wgmma and TMA copies run."""
    return gluon is not None and t.device.type == "cuda" and torch.cuda.get_device_capability(t.device)[0] == 9


def element_type(dtype: torch.dtype):
    """Gluon's element type of a 16-bit torch dtype."""
    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]


def descriptor_type(dtype: torch.dtype, block, layout) -> str:
    """A tensor-descriptor argument's type in a compile signature: ``block`` of ``dtype`` in
    shared ``layout``."""
    el = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    return f"tensordesc<{el}[{', '.join(map(str, block))}],{layout!r}>"


def copies_fit(q: torch.Tensor, k: torch.Tensor, *more: torch.Tensor) -> int:
    """``G``, the query heads a KV head, where the Gluon kernels' TMA copies take ``q`` ``[B, T, HQ,
    D]``, ``k`` ``[B, TK, H, D]`` and ``more`` as row matrices: contiguous, 16-bit, 128-wide heads, 8-64
    heads a KV head (64 rows a warpgroup hold whole positions); else 0."""
    tensors = (q, k, *more)
    if not all(t.is_contiguous() and t.shape[3] == 128 for t in tensors):
        return 0
    if q.dtype not in (torch.bfloat16, torch.float16):
        return 0
    G = q.shape[2] // k.shape[2]
    return G if G in (8, 16, 32, 64) else 0


def copy_layouts(dtype: torch.dtype, head_rows: int, key_rows: int, D: int):
    """Shared layouts of the kernels' two kinds of TMA copies of ``dtype``: ``head_rows`` rows of a query
    tensor (one position's heads of a KV group) and ``key_rows`` rows of a key tensor, ``D`` wide."""
    el = element_type(dtype)
    return (gl.NVMMASharedLayout.get_default_for([head_rows, D], el),
            gl.NVMMASharedLayout.get_default_for([key_rows, D], el))


def head_rows_descriptor(x: torch.Tensor, rows: int, layout):
    """A TMA descriptor over a contiguous ``[B, T, HQ, D]`` tensor seen as ``[B * T * HQ, D]`` rows, a
    copy of ``rows`` rows: row ``((b T + t) H + h) G`` starts position ``t``'s heads of KV head ``h``."""
    flat = x.view(-1, x.shape[-1])
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, x.shape[-1]], layout)


def key_rows_descriptor(x: torch.Tensor, rows: int, layout):
    """A TMA descriptor over a contiguous ``[B, TK, H, D]`` tensor seen as ``[B * TK, H * D]``, a copy of
    ``rows`` keys of one head: row ``b TK + s``, column ``h D``."""
    flat = x.view(x.shape[0] * x.shape[1], -1)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [rows, x.shape[-1]], layout)


def launch_descriptors(heads, keys, key_rows: int) -> list:
    """A launch's TMA descriptors, in order: one over each ``[B, T, HQ, D]`` tensor of ``heads`` (a copy
    a position's ``G`` heads of one KV head, :func:`head_rows_descriptor`), then one over each ``[B, TK,
    H, D]`` tensor of ``keys`` (a copy ``key_rows`` keys of one head, :func:`key_rows_descriptor`)."""
    G = heads[0].shape[2] // keys[0].shape[2]
    row_layout, key_layout = copy_layouts(heads[0].dtype, G, key_rows, heads[0].shape[-1])
    return ([head_rows_descriptor(x, G, row_layout) for x in heads]
            + [key_rows_descriptor(x, key_rows, key_layout) for x in keys])


def descriptor_signature(dtype: torch.dtype, G: int, key_rows: int, heads, keys, D: int = 128) -> Dict[str, str]:
    """:func:`compile_for_sm90`'s signature entries of :func:`launch_descriptors`' descriptors, by the
    names of the kernel's arguments that take them (``heads``, then ``keys``)."""
    row_layout, key_layout = copy_layouts(dtype, G, key_rows, D)
    return {**{name: descriptor_type(dtype, [G, D], row_layout) for name in heads},
            **{name: descriptor_type(dtype, [key_rows, D], key_layout) for name in keys}}


def head_items_grid(B: int, H: int, per_head: int, device: torch.device):
    """A persistent kernel's ``(n_items, grid)``: ``per_head`` work items (tiles of queries or keys) of
    every (batch, KV head), walked by at most one program an SM (:func:`head_item` numbers them)."""
    from nsa.ops._triton.device import sm_count

    n_items = B * H * per_head
    return n_items, (min(n_items, sm_count(device)),)


def compile_for_sm90(kernel, signature: Mapping[str, str], constexprs: Dict[str, object], options: dict,
                     aligned: Sequence[str] = ()):
    """``kernel`` (a Gluon or a Triton kernel) compiled for sm_90 with the installed Triton, without a
    GPU: ``signature`` maps every argument to its type (``"constexpr"`` for those in ``constexprs``,
    which gives their values), ``options`` are the launch's (``num_warps``, ``maxnreg``), ``aligned``
    names the arguments a launch specialises as multiples of 16 (16-byte aligned pointers, as every
    such tensor's; integers divisible by 16). Returns Triton's compiled kernel (``asm``, ``metadata``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource
    if gluon is not None:
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

        source = GluonASTSource if isinstance(kernel, GluonJITFunction) else ASTSource
    names = list(signature)
    values = {(names.index(name),): value for name, value in constexprs.items()}
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    return triton.compile(source(kernel, dict(signature), values, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(options))


def launch_failed(what: str, flag: str, exc: Exception) -> RuntimeError:
    """The error a Gluon launch raises when the installed Triton cannot build or run it: names the
    kernel, the Triton release and the flag that runs the Triton kernel instead."""
    import triton

    return RuntimeError(f"{what}'s Gluon kernel failed with Triton {triton.__version__} ({type(exc).__name__}: "
                        f"{exc}); {flag}=0 runs the Triton kernel instead")


if gluon is not None:

    @gluon.jit
    def ring_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
        """The barriers of a ring of ``STAGES`` slots that a copy warp fills and ``CONSUMERS`` computing
        warpgroups release: ``(kv_bar, ready, empty)``. ``kv_bar`` waits for a program's one-off copies
        (their bytes), each slot's ``ready`` for its copies' bytes and the copy warp's own arrival once
        it has stored the slot's row vectors, its ``empty`` for every consumer's release; every slot
        starts released."""
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=2)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        fence_async_shared()
        for i in gl.static_range(STAGES):
            mbarrier.arrive(empty.index(i), count=CONSUMERS)
        return kv_bar, ready, empty

    @gluon.jit
    def fill_key_slot(k_desc, v_desc, k_smem, v_smem, ready, empty, step, key0, col, STAGES: gl.constexpr):
        """A copy warp's ring step ``step`` (counted from the program's start): once every consumer has
        released its slot, the ``k`` and ``v`` tiles at row ``key0``, column ``col`` into it, then the
        copy warp's own arrival on its ``ready`` (:func:`ring_barriers`)."""
        slot = step % STAGES
        mbarrier.wait(empty.index(slot), (step // STAGES) & 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma_load(k_desc, [key0, col], bar, k_smem.index(slot))
        tma_load(v_desc, [key0, col], bar, v_smem.index(slot))
        mbarrier.arrive(bar)

    @gluon.jit
    def released_barrier(CONSUMERS: gl.constexpr):
        """A persistent program's barrier for its one-off copies of an item (the rows a copy warp loads
        once an item): ``CONSUMERS`` computing warpgroups release it once the item's products that read
        those rows are done, and the copy warp waits for that before it loads the next item's; it
        starts released."""
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=CONSUMERS)
        fence_async_shared()
        mbarrier.arrive(bar, count=CONSUMERS)
        return bar

    @gluon.jit
    def head_item(item, per_head, H: gl.constexpr):
        """``(i_b, i_h, index)`` of a persistent kernel's work item ``item``: the ``per_head`` items of
        one (batch, KV head) are consecutive (the programs running at a time then work on neighbouring
        tiles of one head, whose loads L2 serves once), ``index`` the item's among them."""
        bh = item // per_head
        return bh // H, bh % H, item % per_head

    @gluon.jit
    def visible_compressed(t, NC, L: gl.constexpr, S: gl.constexpr):
        """Compressed tokens visible at positions ``t`` (spec ``Nc(t)``) for compression blocks of ``L``
        tokens at stride ``S``, capped at ``NC``: the Triton kernels' ``visible_cmp`` (Gluon cannot call
        Triton functions)."""
        return gl.minimum(gl.where(t + 1 >= L, (t + 1 - L) // S + 1, 0), NC)

    @gluon.jit
    def store_scaled(out, acc, offs, mask, scale, ACC: gl.constexpr):
        """``acc * scale`` into ``out`` at ``offs`` in its dtype; with ``ACC`` plus what ``out`` held,
        rounded once (the Triton kernels' ``store_scaled`` rule)."""
        acc = acc * scale
        if ACC:
            acc = acc + gl.load(out + offs, mask=mask, other=0.0).to(gl.float32)
        gl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)
else:  # pragma: no cover - an older Triton: the kernels' helpers exist only with Gluon
    ring_barriers = fill_key_slot = released_barrier = head_item = store_scaled = visible_compressed = None
