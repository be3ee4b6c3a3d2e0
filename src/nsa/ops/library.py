"""NSA's ops as ``torch.library`` custom ops: what ``torch.compile`` and ``torch.export`` hold.

Eagerly, a public op runs its Python: guards, routing, Triton launches. Dynamo must not trace
that Python (Inductor would recompile the Triton kernels, and fails to: see
:func:`nsa.ops._dispatch.public_op`), so under ``torch.compile`` the public ops that a model
calls, :func:`nsa.nsa_attention`, :func:`nsa.ops.mean_compress`, :func:`nsa.ops.nsa_decode` and
:func:`nsa.ops.apply_rotary`, call the custom ops below instead. Each is one opaque node of the
graph: its fake implementation gives the output's shape and dtype, its implementation calls the
eager op at run time, so a compiled model holds NSA without a graph break (``fullgraph=True``,
``torch.export``) and computes what the eager model computes.

Backward:

- Where every training op of :func:`nsa.nsa_attention` routes to Triton, ``nsa::attention_train``
  returns the branches' outputs and lse beside ``o``, and its backward,
  ``nsa::attention_train_backward``, is the eager Triton backward (:mod:`nsa.ops.training`): the
  same kernels on the same tensors, so the gradients are eager's, bitwise.
- ``nsa::mean_compress``'s backward is the Triton kernel's (on the reference route a gradient
  runs eagerly); ``nsa::rotary``'s is the rotation by the opposite angle, on either route.
- A gradient through :func:`nsa.nsa_attention` on any other route (the reference, float32 where
  it stays in PyTorch) runs eagerly: a custom op's implementation cannot record autograd, and
  those routes' backward is autograd's.

Routing is read when the graph is traced (``NSA_`` flags changed later need
``torch._dynamo.reset()``), and a packed batch (``cu_seqlens``) runs eagerly, a graph break:
its layout is host work.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from nsa.config import NSAConfig

Tensor = torch.Tensor

#: The config's integer fields: a custom op takes them as one ``int[]`` (and the scale apart)
_GEOMETRY = ("cmp_block", "cmp_stride", "sel_block", "sel_count", "init_blocks", "local_blocks", "window")


def _geometry(config: NSAConfig) -> List[int]:
    return [getattr(config, name) for name in _GEOMETRY]


def _config(geometry: Sequence[int], scale: Optional[float]) -> NSAConfig:
    return NSAConfig(**{name: int(x) for name, x in zip(_GEOMETRY, geometry)}, scale=scale)


def _absent(like: Tensor) -> Tensor:
    """An output standing for "no tensor" (custom ops return tensors only): empty, on ``like``'s device."""
    return like.new_empty(0)


def _or_absent(t: Optional[Tensor], like: Tensor) -> Tensor:
    return t if t is not None else _absent(like)


def _or_none(t: Tensor, present: object) -> Optional[Tensor]:
    """Back from :func:`_or_absent`: ``t`` where ``present`` is not None (the input was given)."""
    return t if present is not None else None


# ---------------------------------------------------------------------------------------------
# nsa::attention: any route, no gradient


@torch.library.custom_op("nsa::attention", mutates_args=())
def _attention(
    q: Tensor, k: Tensor, v: Tensor, gates: Tensor, k_cmp: Tensor, v_cmp: Tensor, k_win: Optional[Tensor],
    v_win: Optional[Tensor], geometry: List[int], scale: Optional[float], q_offset: int, backend: Optional[str],
) -> Tuple[Tensor, Tensor]:
    from nsa.ops.combine import nsa_attention

    kv_win = (k_win, v_win) if k_win is not None else None
    with torch.no_grad():
        o, block_idx = nsa_attention(q, k, v, gates, _config(geometry, scale), kv_cmp=(k_cmp, v_cmp), kv_win=kv_win,
                                     q_offset=q_offset, backend=backend, return_block_idx=True)
    return o.contiguous(), block_idx.contiguous()  # the fake's layout, whatever the route returns


@_attention.register_fake
def _(q, k, v, gates, k_cmp, v_cmp, k_win, v_win, geometry, scale, q_offset, backend):
    return _outputs_like(q, k, v, geometry)


def _outputs_like(q: Tensor, k: Tensor, v: Tensor, geometry: Sequence[int]) -> Tuple[Tensor, Tensor]:
    """Empty ``(o, block_idx)`` as the attention ops return them."""
    B, T, HQ, _ = q.shape
    o = q.new_empty(B, T, HQ, v.shape[-1])
    count = geometry[_GEOMETRY.index("sel_count")]
    return o, torch.empty(B, T, k.shape[2], count, dtype=torch.int32, device=q.device)


# ---------------------------------------------------------------------------------------------
# nsa::attention_train: every training op on Triton; backward by the Triton training kernels


@torch.library.custom_op("nsa::attention_train", mutates_args=())
def _attention_train(
    q: Tensor, k: Tensor, v: Tensor, gates: Tensor, k_cmp: Tensor, v_cmp: Tensor, k_win: Optional[Tensor],
    v_win: Optional[Tensor], geometry: List[int], scale: Optional[float], q_offset: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from nsa.ops.combine import check_arguments
    from nsa.ops.training import prepared, training_forward

    config = _config(geometry, scale)
    check_arguments(q, k, v, gates, config, (k_cmp, v_cmp), (k_win, v_win) if k_win is not None else None)
    q, k, v, gates, k_cmp, v_cmp, k_win, v_win = prepared(q, k, v, gates, k_cmp, v_cmp, k_win, v_win, q_offset)
    with torch.no_grad():
        o, block_idx, residuals = training_forward(q, k, v, k_cmp, v_cmp, gates, k_win, v_win, config, q_offset)
    return (o, block_idx, *residuals)


@_attention_train.register_fake
def _(q, k, v, gates, k_cmp, v_cmp, k_win, v_win, geometry, scale, q_offset):
    o, block_idx = _outputs_like(q, k, v, geometry)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    return (o, block_idx, *(x for _ in range(3) for x in (torch.empty_like(o), torch.empty_like(lse))))


@torch.library.custom_op("nsa::attention_train_backward", mutates_args=())
def _attention_train_backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, gates: Tensor, k_cmp: Tensor, v_cmp: Tensor, k_win: Optional[Tensor],
    v_win: Optional[Tensor], block_idx: Tensor, residuals: List[Tensor], geometry: List[int], scale: Optional[float],
    q_offset: int, attention: bool,
) -> List[Tensor]:
    from nsa.ops.training import prepared, training_backward

    q, k, v, gates, k_cmp, v_cmp, k_win, v_win = prepared(q, k, v, gates, k_cmp, v_cmp, k_win, v_win, q_offset)
    dq, dk, dv, dk_cmp, dv_cmp, dgates, dk_win, dv_win = training_backward(
        do, q, k, v, k_cmp, v_cmp, gates, k_win, v_win, block_idx, tuple(residuals), _config(geometry, scale),
        q_offset, attention)
    return [_or_absent(g, q) for g in (dq, dk, dv, dgates, dk_cmp, dv_cmp, dk_win, dv_win)]  # nsa::attention's order


@_attention_train_backward.register_fake
def _(do, q, k, v, gates, k_cmp, v_cmp, k_win, v_win, block_idx, residuals, geometry, scale, q_offset, attention):
    shared = k_win is None
    grads = (q, k, v, gates, k_cmp, v_cmp, k_win, v_win)
    wanted = [attention] * 3 + [True] + [attention] * 2 + [attention and not shared] * 2
    # contiguous, as the kernels write them, whatever the inputs' strides (empty_like would keep those)
    return [t.new_empty(t.shape) if want else _absent(q) for t, want in zip(grads, wanted)]


def _train_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:8], *output[1:])
    ctx.args = inputs[8:]
    ctx.mark_non_differentiable(*output[1:])


def _train_grads(ctx, do, *_):
    q, k, v, gates, k_cmp, v_cmp, k_win, v_win, block_idx, *residuals = ctx.saved_tensors
    # the branches' backwards only when a tensor other than the gates needs a gradient
    attention = any(need for i, need in enumerate(ctx.needs_input_grad[:8]) if i != 3)
    grads = _attention_train_backward(do, q, k, v, gates, k_cmp, v_cmp, k_win, v_win, block_idx, residuals,
                                      *ctx.args, attention)
    present = (q, k, v, gates, k_cmp, v_cmp, k_win, v_win) if attention else (None,) * 3 + (gates,) + (None,) * 4
    return (*(_or_none(g, t) for g, t in zip(grads, present)), None, None, None)


_attention_train.register_autograd(_train_grads, setup_context=_train_setup)


# ---------------------------------------------------------------------------------------------
# nsa::mean_compress (the Triton backward where it routes to Triton), nsa::decode (no backward),
# nsa::rotary (backward: the opposite rotation)


@torch.library.custom_op("nsa::mean_compress", mutates_args=())
def _mean_compress(x: Tensor, geometry: List[int], backend: Optional[str]) -> Tensor:
    from nsa.ops.compress import mean_compress

    with torch.no_grad():
        return mean_compress(x, _config(geometry, None), backend=backend).contiguous()


@_mean_compress.register_fake
def _(x, geometry, backend):
    B, T, H, D = x.shape
    return x.new_empty(B, _config(geometry, None).num_cmp(T), H, D)


@torch.library.custom_op("nsa::mean_compress_backward", mutates_args=())
def _mean_compress_backward(dy: Tensor, length: int, geometry: List[int]) -> Tensor:
    from nsa.ops.compress.kernel import mean_compress_bwd

    return mean_compress_bwd(dy, length, _config(geometry, None))


@_mean_compress_backward.register_fake
def _(dy, length, geometry):
    B, _, H, D = dy.shape
    return dy.new_empty(B, length, H, D)


def _mean_compress_setup(ctx, inputs, output):
    ctx.length, ctx.geometry = inputs[0].shape[1], inputs[1]


def _mean_compress_grads(ctx, dy):
    return _mean_compress_backward(dy, ctx.length, ctx.geometry), None, None


_mean_compress.register_autograd(_mean_compress_grads, setup_context=_mean_compress_setup)


@torch.library.custom_op("nsa::decode", mutates_args=())
def _decode(
    q: Tensor, k: Tensor, v: Tensor, gates: Tensor, seq_lens: Tensor, k_cmp: Tensor, v_cmp: Tensor,
    k_win: Optional[Tensor], v_win: Optional[Tensor], geometry: List[int], scale: Optional[float],
    backend: Optional[str],
) -> Tuple[Tensor, Tensor]:
    from nsa.ops.decode import nsa_decode

    kv_win = (k_win, v_win) if k_win is not None else None
    o, block_idx = nsa_decode(q, k, v, gates, seq_lens, _config(geometry, scale), kv_cmp=(k_cmp, v_cmp),
                              kv_win=kv_win, backend=backend, return_block_idx=True)
    return o.contiguous(), block_idx.contiguous()


@_decode.register_fake
def _(q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win, geometry, scale, backend):
    return _outputs_like(q, k, v, geometry)


@torch.library.custom_op("nsa::rotary", mutates_args=())
def _rotary(x: Tensor, cos: Tensor, sin: Tensor, backend: Optional[str]) -> Tensor:
    from nsa.ops.rotary import apply_rotary

    with torch.no_grad():
        return apply_rotary(x, cos, sin, backend=backend).contiguous()


@_rotary.register_fake
def _(x, cos, sin, backend):
    return x.new_empty(x.shape)


def _rotary_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[2])
    ctx.backend = inputs[3]


def _rotary_grads(ctx, dy):
    cos, sin = ctx.saved_tensors
    # the adjoint of a rotation is the rotation by the opposite angle (as the eager backward)
    return _rotary(dy, cos, -sin, ctx.backend), None, None, None


_rotary.register_autograd(_rotary_grads, setup_context=_rotary_setup)


# ---------------------------------------------------------------------------------------------
# The traced side of the public ops (nsa.ops._dispatch.public_op calls these under torch.compile)


@torch.compiler.assume_constant_result
def _on_triton(ops: Tuple[str, ...], device: torch.device, dtype: torch.dtype,
               head_dim: Optional[Tuple[int, int]],
               backend: Optional[str]) -> bool:
    """:func:`nsa.routing.all_triton`, read once, when the graph is traced."""
    from nsa import routing  # lazily, like nsa.ops._dispatch

    return routing.all_triton(ops, device, dtype, backend, head_dim)


def _needs_grad(*tensors: Optional[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def nsa_attention(q, k, v, gates, config, *, kv_cmp=None, kv_win=None, q_offset=0, backend=None,
                  return_block_idx=False, cu_seqlens=None, max_seqlen=None):
    """:func:`nsa.nsa_attention` traced: one custom op. NotImplemented where the call runs eagerly:
    a packed batch, or a gradient on a route that is not Triton's throughout."""
    from nsa.ops.combine import TRAINING_OPS

    if cu_seqlens is not None or max_seqlen is not None:
        return NotImplemented
    k_win, v_win = kv_win if kv_win is not None else (None, None)
    k_cmp, v_cmp = kv_cmp if kv_cmp is not None else (mean_compress(k, config, backend=backend),
                                                      mean_compress(v, config, backend=backend))
    if k_cmp is NotImplemented or v_cmp is NotImplemented:
        return NotImplemented
    tensors, geometry = (q, k, v, gates, k_cmp, v_cmp, k_win, v_win), _geometry(config)
    if not _needs_grad(*tensors):
        o, block_idx = _attention(*tensors, geometry, config.scale, q_offset, backend)
    elif q.shape[1] > 0 and _on_triton(TRAINING_OPS, q.device, q.dtype, (q.shape[-1], v.shape[-1]), backend):
        o, block_idx, *_ = _attention_train(*tensors, geometry, config.scale, q_offset)
    else:
        return NotImplemented
    return (o, block_idx) if return_block_idx else o


def mean_compress(x, config, *, backend=None):
    """:func:`nsa.ops.mean_compress` traced: one custom op. NotImplemented (eager) for a gradient
    on the reference route."""
    if _needs_grad(x) and not _on_triton(("compress",), x.device, x.dtype, None, backend):
        return NotImplemented
    return _mean_compress(x, _geometry(config), backend)


def nsa_decode(q, k, v, gates, seq_lens, config, *, kv_cmp, kv_win=None, backend=None, return_block_idx=False):
    """:func:`nsa.ops.nsa_decode` traced: one custom op (gates given as their projection are
    computed first, by ops that Inductor fuses)."""
    from nsa.ops.gates.projection import GateProjection

    if isinstance(gates, GateProjection):
        gates = gates.evaluate(q.shape[2])
    k_win, v_win = kv_win if kv_win is not None else (None, None)
    o, block_idx = _decode(q, k, v, gates, seq_lens, *kv_cmp, k_win, v_win, _geometry(config), config.scale, backend)
    return (o, block_idx) if return_block_idx else o


def apply_rotary(x, cos, sin, *, backend=None):
    """:func:`nsa.ops.apply_rotary` traced: one custom op."""
    return _rotary(x, cos, sin, backend)
