"""What the benchmarks time: one NSA decode step, one prefill, and dense SDPA beside each.

Everything goes through nsa's public ops, so a benchmark measures whatever the
router picks (:func:`routes` records it). One :class:`Shape` describes a point;
the builders return a :class:`~nsa.bench.timing.Runner` holding fresh random
inputs (never zeros), enough independent sets to rotate through, and the call:

- decode, NSA: :func:`nsa.ops.decode.nsa_decode` for one new token per sequence
  over a full cache of ``S = shape.length`` positions (the token included),
  compressed tokens already emitted by :func:`nsa.ops.mean_compress`; one K/V
  pair serves the three branches, as dense reads one pair.
- decode, dense: ``scaled_dot_product_attention`` of the new token over the same
  context (``enable_gqa``; K/V in SDPA's own ``[B, H, S, D]`` layout).
- decode, each branch alone: the prefill ops with ``q_offset = S - 1``
  (``cmp``: compressed attention, ``select``: block scores and top-n,
  ``slc``: selected attention on those blocks, ``win``: sliding window).
- prefill: :func:`nsa.nsa_attention` (mean compression included) against causal
  SDPA, forward under ``no_grad`` or forward + ``torch.autograd.grad`` of all inputs.
- packed batches: :func:`nsa.nsa_attention` with ``cu_seqlens`` over a pack of documents
  (:func:`pack_lengths`) against causal dense attention over the same pack.
"""

from __future__ import annotations

import contextlib
import inspect
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from nsa import routing
from nsa.bench.timing import Runner, input_set_count
from nsa.config import NSAConfig
from nsa.modules.cache import count_reads
from nsa.ops import (
    compressed_attention,
    mean_compress,
    nsa_attention,
    select_blocks,
    selected_attention,
    sliding_window_attention,
)
from nsa.ops import varlen
from nsa.ops.decode import nsa_decode

DTYPES: Dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
    "fp32": torch.float32, "float32": torch.float32,
}  # fmt: skip
#: ``(heads, kv_heads, head_dim, dtype)`` per device type: the GPU shape of PERF_NOTES, and a
#: CPU shape small enough that the CPU suite runs in seconds on two cores.
DEVICE_DEFAULTS: Dict[str, Tuple[int, int, int, torch.dtype]] = {
    "cuda": (64, 4, 128, torch.bfloat16),
    "cpu": (4, 1, 32, torch.float32),
}
#: NSA geometry per device type: the paper's on a GPU; on a CPU every size scaled down (l=16,
#: d=8, l'=32, n=8, w=128), so that the CPU profile's short contexts (512-2048) are long
#: relative to the blocks and the step is as sparse as a GPU step at 16k-32k.
DEVICE_CONFIGS: Dict[str, NSAConfig] = {
    "cuda": NSAConfig(),
    "cpu": NSAConfig(cmp_block=16, cmp_stride=8, sel_block=32, sel_count=8, window=128),
}
#: The routed ops each workload runs (their backends go into every record).
PREFILL_OPS = ("compress", "compressed", "select", "selected", "window")
DECODE_OPS = ("decode", "compressed", "select", "selected", "window")
BRANCHES = ("cmp", "select", "slc", "win")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_dtype(name: str) -> torch.dtype:
    """``"bf16"``/``"bfloat16"``, ``"fp16"``/``"float16"``, ``"fp32"``/``"float32"``."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}") from None


@dataclass(frozen=True)
class Shape:
    """One benchmark point.

    Attributes:
        batch: B.
        length: decode: the context S (cache positions, the new token included);
            prefill: the sequence length T.
        heads, kv_heads: HQ and H (``H | HQ``).
        head_dim: D (keys and values).
        dtype: of every input.
    """

    batch: int
    length: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("batch", "length", "heads", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Shape.{name} must be a positive int, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"Shape.heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")
        if self.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"Shape.dtype must be bfloat16, float16 or float32, got {self.dtype}")

    @classmethod
    def default(cls, device: torch.device, batch: int, length: int) -> "Shape":
        """The point at ``batch``/``length`` with :data:`DEVICE_DEFAULTS` of ``device``'s type."""
        heads, kv_heads, head_dim, dtype = DEVICE_DEFAULTS["cuda" if torch.device(device).type == "cuda" else "cpu"]
        return cls(batch, length, heads, kv_heads, head_dim, dtype)

    def describe(self) -> Dict[str, Any]:
        """Plain fields for reports and baseline matching."""
        return {"batch": self.batch, "length": self.length, "heads": self.heads, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "dtype": dtype_name(self.dtype)}  # fmt: skip


def default_config(device: torch.device) -> NSAConfig:
    """:data:`DEVICE_CONFIGS` for ``device``'s type."""
    return DEVICE_CONFIGS["cuda" if torch.device(device).type == "cuda" else "cpu"]


def describe_config(config: NSAConfig) -> str:
    """``"l=32 d=16 l'=64 n=16 w=512"`` (plus init/local blocks when not the defaults)."""
    text = f"l={config.cmp_block} d={config.cmp_stride} l'={config.sel_block} n={config.sel_count} w={config.window}"
    if (config.init_blocks, config.local_blocks) != (1, 2):
        text += f" init={config.init_blocks} local={config.local_blocks}"
    return text


def point_info(shape: Shape, config: NSAConfig) -> Dict[str, Any]:
    """The ``shape`` record of a benchmark point: :meth:`Shape.describe` plus the geometry."""
    return {**shape.describe(), "config": describe_config(config)}


def routes(ops: Iterable[str], device: torch.device, dtype: torch.dtype) -> Dict[str, str]:
    """``{op: backend}`` the router picks for ``ops`` on ``device``/``dtype`` (flags included)."""
    return {op: routing.resolve(op, device, dtype).backend for op in ops}


def graph_status(impl: str, device: torch.device, dtype: torch.dtype) -> Tuple[bool, str]:
    """``(ok, reason)``: can the decode step of ``impl`` (``"nsa"``/``"dense"``) be captured
    into a CUDA graph here? NSA needs a sync-free decode route (the Triton one)."""
    if torch.device(device).type != "cuda":
        return False, "CUDA graphs need a CUDA device"
    if impl == "nsa":
        route = routing.resolve("decode", device, dtype)
        if route.backend != "triton":
            return False, f"decode route is '{route.backend}' ({route.reason}), which syncs with the host"
    return True, "capturable"


def _randn(*size: int, dtype: torch.dtype, device: torch.device, grad: bool = False) -> torch.Tensor:
    return torch.randn(*size, dtype=dtype, device=device).requires_grad_(grad)


def _nbytes(tensors: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _runner(
    fn: Callable[..., Any],
    make_set: Callable[[], Tuple[Any, ...]],
    device: torch.device,
    *,
    flush_l2: bool,
    graph: bool = False,
    sets: Optional[int] = None,
    queued: bool = False,
) -> Runner:
    first = make_set()
    count = sets if sets is not None else input_set_count(_nbytes(first), device)
    input_sets = [first] + [make_set() for _ in range(count - 1)]
    return Runner(fn, input_sets, device, flush_l2=flush_l2, graph=graph, queued=queued)


# -- decode ------------------------------------------------------------------------------


def _decode_set(shape: Shape, config: NSAConfig, device: torch.device) -> Tuple[torch.Tensor, ...]:
    B, S, HQ, H, D = shape.batch, shape.length, shape.heads, shape.kv_heads, shape.head_dim
    k = _randn(B, S, H, D, dtype=shape.dtype, device=device)
    v = _randn(B, S, H, D, dtype=shape.dtype, device=device)
    q = _randn(B, 1, HQ, D, dtype=shape.dtype, device=device)
    gates = torch.rand(B, 1, HQ, 3, dtype=shape.dtype, device=device)
    seq_lens = torch.full((B,), S, dtype=torch.int32, device=device)
    return q, k, v, gates, seq_lens, mean_compress(k, config), mean_compress(v, config)


def _nsa_step(config: NSAConfig) -> Callable[..., torch.Tensor]:
    def step(q, k, v, gates, seq_lens, k_cmp, v_cmp):  # noqa: ANN001 - the decode op checks them
        return nsa_decode(q, k, v, gates, seq_lens, config, kv_cmp=(k_cmp, v_cmp))

    return step


def _dense_decode_set(shape: Shape, device: torch.device) -> Tuple[torch.Tensor, ...]:
    B, S, HQ, H, D = shape.batch, shape.length, shape.heads, shape.kv_heads, shape.head_dim
    q = _randn(B, HQ, 1, D, dtype=shape.dtype, device=device)
    return q, _randn(B, H, S, D, dtype=shape.dtype, device=device), _randn(B, H, S, D, dtype=shape.dtype, device=device)


def _dense_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def decode_runner(
    impl: str,
    shape: Shape,
    config: NSAConfig,
    device: torch.device,
    *,
    graph: bool = False,
    flush_l2: bool = True,
    sets: Optional[int] = None,
) -> Runner:
    """A :class:`Runner` of one decode step of ``impl`` (``"nsa"`` or ``"dense"``) at ``shape``."""
    if impl == "nsa":
        return _runner(_nsa_step(config), lambda: _decode_set(shape, config, device), device,
                       flush_l2=flush_l2, graph=graph, sets=sets)  # fmt: skip
    if impl == "dense":
        return _runner(_dense_step, lambda: _dense_decode_set(shape, device), device,
                       flush_l2=flush_l2, graph=graph, sets=sets)  # fmt: skip
    raise ValueError(f"impl must be 'nsa' or 'dense', got {impl!r}")


def _branch_fns(config: NSAConfig, offset: int) -> Dict[str, Callable[..., torch.Tensor]]:
    def cmp(q, k, v, k_cmp, v_cmp, block_idx):  # noqa: ANN001
        return compressed_attention(q, k_cmp, v_cmp, config, q_offset=offset)[0]

    def select(q, k, v, k_cmp, v_cmp, block_idx):  # noqa: ANN001
        return select_blocks(q, k_cmp, config, q_offset=offset)

    def slc(q, k, v, k_cmp, v_cmp, block_idx):  # noqa: ANN001
        return selected_attention(q, k, v, block_idx, config, q_offset=offset)

    def win(q, k, v, k_cmp, v_cmp, block_idx):  # noqa: ANN001
        return sliding_window_attention(q, k, v, config, q_offset=offset)

    return {"cmp": cmp, "select": select, "slc": slc, "win": win}


def branch_runners(
    shape: Shape, config: NSAConfig, device: torch.device, *, flush_l2: bool = True, sets: Optional[int] = None
) -> Dict[str, Runner]:
    """One :class:`Runner` per branch of the decode step (:data:`BRANCHES`), each running that
    branch's op alone at the new token's position ``S - 1``, on shared input sets; the
    selected branch reads the blocks the selection really picks for that input."""

    def make_set() -> Tuple[torch.Tensor, ...]:
        q, k, v, _, _, k_cmp, v_cmp = _decode_set(shape, config, device)
        block_idx = select_blocks(q, k_cmp, config, q_offset=shape.length - 1)
        return q, k, v, k_cmp, v_cmp, block_idx

    first = make_set()
    count = sets if sets is not None else input_set_count(_nbytes(first), device)
    input_sets = [first] + [make_set() for _ in range(count - 1)]
    fns = _branch_fns(config, shape.length - 1)
    return {name: Runner(fns[name], input_sets, device, flush_l2=flush_l2) for name in BRANCHES}


def decode_reads(shape: Shape, config: NSAConfig, device: torch.device) -> Tuple[float, int]:
    """``(actual, expected)`` tokens one decode step reads at context ``shape.length``.

    ``actual`` counts the positions of the blocks the step really selects (mean over
    batch and KV heads) plus the visible compressed tokens and the window, from the
    decode op's own ``block_idx``; ``expected`` is the spec's formula
    (:meth:`nsa.NSAConfig.decode_reads`). This syncs with the device: call it
    outside the timed region.
    """
    q, k, v, gates, seq_lens, k_cmp, v_cmp = _decode_set(shape, config, device)
    _, block_idx = nsa_decode(q, k, v, gates, seq_lens, config, kv_cmp=(k_cmp, v_cmp), return_block_idx=True)
    actual = count_reads(block_idx, shape.length - 1, config).last_step()["total"]
    return actual, config.decode_reads(shape.length)


# -- prefill -----------------------------------------------------------------------------


#: Dense prefill variants: SDPA's own choice, or one SDPA backend forced (CUDA only).
DENSE_PREFILL_BACKENDS = {"dense": None, "dense_flash": "FLASH_ATTENTION", "dense_cudnn": "CUDNN_ATTENTION"}


def _sdpa_backend(impl: str):
    """Context that restricts SDPA to the backend of dense variant ``impl`` (none for ``dense``)."""
    name = DENSE_PREFILL_BACKENDS[impl]
    if name is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name)])


def prefill_inputs(impl: str, shape: Shape, device: torch.device, backward: bool) -> Tuple[torch.Tensor, ...]:
    """Fresh random inputs of one prefill call of ``impl`` (see :func:`prefill_runner`): NSA's
    ``(q, k, v, gates)`` in ``[B, T, heads, D]``, dense SDPA's ``(q, k, v)`` in its own
    ``[B, heads, T, D]``; with ``backward`` they require gradients and an output gradient follows."""
    B, T, HQ, H, D = shape.batch, shape.length, shape.heads, shape.kv_heads, shape.head_dim
    like = dict(dtype=shape.dtype, device=device, grad=backward)
    if impl in DENSE_PREFILL_BACKENDS:  # SDPA's own layout: [B, heads, T, D]
        q, k, v = _randn(B, HQ, T, D, **like), _randn(B, H, T, D, **like), _randn(B, H, T, D, **like)
        return (q, k, v, _randn(B, HQ, T, D, dtype=shape.dtype, device=device)) if backward else (q, k, v)
    q, k, v = _randn(B, T, HQ, D, **like), _randn(B, T, H, D, **like), _randn(B, T, H, D, **like)
    gates = torch.rand(B, T, HQ, 3, dtype=shape.dtype, device=device).requires_grad_(backward)
    if backward:
        return q, k, v, gates, _randn(B, T, HQ, D, dtype=shape.dtype, device=device)
    return q, k, v, gates


def _fwd_or_fwd_bwd(forward: Callable[..., torch.Tensor], backward: bool) -> Callable[..., Any]:
    """``forward`` under ``no_grad``, or (``backward``) forward and the gradients of every input
    given the output gradient that follows them."""

    def fwd(*inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return forward(*inputs)

    def fwd_bwd(*inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        # autograd.grad returns fresh gradients: nothing accumulates across rounds.
        *args, grad_out = inputs
        with torch.enable_grad():
            return torch.autograd.grad(forward(*args), args, grad_out)

    return fwd_bwd if backward else fwd


def _prefill_fn(impl: str, config: NSAConfig, backward: bool) -> Callable[..., Any]:
    def forward(*inputs: torch.Tensor) -> torch.Tensor:
        if impl in DENSE_PREFILL_BACKENDS:
            # The backward runs the kernel that matches the forward's, so the context covers both.
            with _sdpa_backend(impl):
                return F.scaled_dot_product_attention(*inputs, is_causal=True, enable_gqa=True)
        return nsa_attention(*inputs, config)

    return _fwd_or_fwd_bwd(forward, backward)


def prefill_runner(
    impl: str,
    shape: Shape,
    config: NSAConfig,
    device: torch.device,
    *,
    backward: bool,
    flush_l2: bool = True,
    sets: Optional[int] = None,
    queued: bool = False,
) -> Runner:
    """A :class:`Runner` of one prefill of ``impl`` at ``shape``: forward only, or
    (``backward``) forward and the gradients of every input. ``impl`` is ``"nsa"``,
    ``"dense"`` (SDPA's own backend choice) or ``"dense_flash"``/``"dense_cudnn"``.
    ``queued``: calls enqueued back to back (device time, as ``do_bench``), see :class:`Runner`."""
    if impl != "nsa" and impl not in DENSE_PREFILL_BACKENDS:
        raise ValueError(f"impl must be 'nsa' or one of {', '.join(DENSE_PREFILL_BACKENDS)}, got {impl!r}")
    return _runner(_prefill_fn(impl, config, backward), lambda: prefill_inputs(impl, shape, device, backward),
                   device, flush_l2=flush_l2, sets=sets, queued=queued)  # fmt: skip


# -- packed batches (cu_seqlens) -----------------------------------------------------------

#: Kinds of pack :func:`pack_lengths` draws.
PACK_KINDS = ("lognormal", "long", "uniform", "one_long")


def pack_lengths(kind: str, total: int, seed: int = 0) -> List[int]:
    """Sequence lengths summing to ``total``, drawn (seeded) as a data loader that packs documents
    would; the last one is cut to fit. For a pack of 64k tokens: ``lognormal``, median about 1.1k
    tokens (``exp(N(7, 1))``); ``long``, about 4.9k (``exp(N(8.5, 1))``); ``uniform``, 1 to 16k;
    ``one_long``, one document of half the pack, then ``lognormal`` ones. Other totals scale the
    drawn lengths by ``total / 64k``, so a small pack holds as many documents."""
    if kind not in PACK_KINDS:
        raise ValueError(f"pack kind must be one of {', '.join(PACK_KINDS)}, got {kind!r}")
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"a pack's total must be a positive int, got {total!r}")
    rng = random.Random(seed)
    draw = {"lognormal": lambda: rng.lognormvariate(7.0, 1.0), "long": lambda: rng.lognormvariate(8.5, 1.0),
            "uniform": lambda: rng.randint(1, 16384)}["lognormal" if kind == "one_long" else kind]
    scale = total / 65536
    lengths = [total // 2] if kind == "one_long" and total > 1 else []
    filled = sum(lengths)
    while filled < total:
        lengths.append(max(1, min(int(draw() * scale), total - filled)))
        filled += lengths[-1]
    return lengths


def _dense_packed_fn(lengths: Sequence[int], heads: int, kv_heads: int, device: torch.device
                     ) -> Tuple[Callable[..., torch.Tensor], str, int]:  # fmt: skip
    """Causal dense attention over a pack ``[1, total, heads, D]``: ``(forward, name, kv heads it
    takes)``. On CUDA ``torch.nn.attention.varlen.varlen_attn`` (flash) where this torch has it,
    its keys and values given all ``heads`` where it has no GQA (repeated outside the timed call);
    elsewhere SDPA over each sequence in turn."""
    cu = varlen.cu_seqlens_of(lengths)
    bounds = cu.tolist()
    varlen_attn = None
    if torch.device(device).type == "cuda":
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            pass
    if varlen_attn is not None:
        params = inspect.signature(varlen_attn).parameters
        causal = dict(is_causal=True) if "is_causal" in params else dict(window_size=(-1, 0))
        gqa = "enable_gqa" in params
        if gqa:
            causal["enable_gqa"] = True
        cu, longest = cu.to(device), max(lengths)

        def over_the_pack(q, k, v):
            return varlen_attn(q[0], k[0], v[0], cu, cu, longest, longest, **causal)[None]

        return over_the_pack, "varlen_attn", kv_heads if gqa else heads

    def per_sequence(q, k, v):
        outs = [F.scaled_dot_product_attention(*(x[:, a:b].transpose(1, 2) for x in (q, k, v)), is_causal=True,
                                               enable_gqa=True).transpose(1, 2) for a, b in zip(bounds, bounds[1:])]
        return torch.cat(outs, 1)

    return per_sequence, "sdpa per sequence", kv_heads


def packed_runner(
    impl: str,
    shape: Shape,
    lengths: Sequence[int],
    config: NSAConfig,
    device: torch.device,
    *,
    backward: bool,
    host_boundaries: bool = True,
    flush_l2: bool = True,
    sets: Optional[int] = None,
    queued: bool = False,
) -> Tuple[Runner, str]:
    """``(runner, what runs)`` of one packed call over sequences of ``lengths`` (``shape.length``
    their sum, ``shape.batch`` 1), forward only or forward and the gradients of every input.

    ``impl`` ``"nsa"``: :func:`nsa.nsa_attention` with ``cu_seqlens`` on the host
    (``host_boundaries``, no sync) or on ``device`` (read back each call). ``"dense"``: causal
    dense attention over the same pack (:func:`_dense_packed_fn` says which)."""
    if impl not in ("nsa", "dense"):
        raise ValueError(f"impl must be 'nsa' or 'dense', got {impl!r}")
    if shape.batch != 1 or sum(lengths) != shape.length:
        raise ValueError(f"a pack is one row of sum(lengths) = {sum(lengths)} tokens, got {shape.describe()}")
    if impl == "nsa":  # the pack is one prefill row: the prefill's inputs, [1, T, heads, D]
        cu = varlen.cu_seqlens_of(lengths)
        cu = cu if host_boundaries else cu.to(device)
        forward, what = (lambda q, k, v, g: nsa_attention(q, k, v, g, config, cu_seqlens=cu)), "nsa"
        make_set = lambda: prefill_inputs("nsa", shape, device, backward)  # noqa: E731
    else:
        T, HQ, D = shape.length, shape.heads, shape.head_dim
        forward, what, kv = _dense_packed_fn(lengths, HQ, shape.kv_heads, device)
        like = dict(dtype=shape.dtype, device=device)

        def make_set() -> Tuple[torch.Tensor, ...]:
            q, k, v = (_randn(1, T, n, D, **like, grad=backward) for n in (HQ, kv, kv))
            return (q, k, v, _randn(1, T, HQ, D, **like)) if backward else (q, k, v)

    runner = _runner(_fwd_or_fwd_bwd(forward, backward), make_set, device, flush_l2=flush_l2, sets=sets,
                     queued=queued)  # fmt: skip
    return runner, what
