"""``nsa_attention``: the three branches and their gated sum (spec: "Gates and output")."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from nsa.config import NSAConfig
from nsa.ops import _guards, varlen
from nsa.ops._dispatch import needs_grad, public_op
from nsa.ops.compress import mean_compress
from nsa.ops.compressed import compressed_attention
from nsa.ops.gates import combine_branches
from nsa.ops.select import select_blocks
from nsa.ops.selected import selected_attention
from nsa.ops.window import sliding_window_attention

KVPair = Tuple[torch.Tensor, torch.Tensor]


def _check_pair(name: str, pair: object, q: torch.Tensor, v: torch.Tensor) -> KVPair:
    """A branch's own ``(k, v)``: checked here so that errors name ``kv_cmp``/``kv_win``."""
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"{name} must be a (k, v) pair of tensors, got {type(pair).__name__}")
    _guards.check_attention_inputs(q, pair[0], pair[1], ("q", f"{name}[0]", f"{name}[1]"))
    if pair[1].shape[-1] != v.shape[-1]:
        raise ValueError(f"{name}[1] has Dv={pair[1].shape[-1]} but v has Dv={v.shape[-1]}; the branches are summed")
    return pair[0], pair[1]


#: The ops of a training step that :mod:`nsa.ops.training` runs as one autograd Function when all
#: route to Triton (its backward shares the softmax deltas and sums ``dq`` inside the kernels).
TRAINING_OPS = ("compressed", "select", "selected", "window", "gates")


def _on_triton(ops: Tuple[str, ...], q: torch.Tensor, v: torch.Tensor, backend: Optional[str]) -> bool:
    """Whether every op of ``ops`` routes to its Triton kernel for queries ``q`` and values ``v``
    (a fused launch needs all; routes depend on the widths of their heads)."""
    from nsa import routing  # lazily, like nsa.ops._dispatch

    return routing.all_triton(ops, q.device, q.dtype, backend, (q.shape[-1], v.shape[-1]))


def _compressed_and_blocks(
    q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, config: NSAConfig, q_offset: int, backend: Optional[str]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The compressed branch and the selected blocks.

    When both ops route to Triton, one launch computes both: the pass that scores
    blocks from the compressed-attention probabilities also produces the output,
    so ``q @ k_cmp`` is not computed by two separate kernels.
    """
    if _on_triton(("compressed", "select"), q, v_cmp, backend):
        _guards.check_attention_inputs(q, k_cmp, v_cmp, ("q", "k_cmp", "v_cmp"))
        _guards.check_q_offset(q_offset, q, None)
        from nsa.ops.compressed.kernel import compressed_attention_select

        o_cmp, _, block_idx = compressed_attention_select(q, k_cmp, v_cmp, config, config.softmax_scale(q.shape[-1]), q_offset)
        return o_cmp, block_idx
    o_cmp, _ = compressed_attention(q, k_cmp, v_cmp, config, q_offset=q_offset, backend=backend)
    return o_cmp, select_blocks(q, k_cmp, config, q_offset=q_offset, backend=backend)


@public_op
def nsa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: torch.Tensor,
    config: NSAConfig,
    *,
    kv_cmp: Optional[KVPair] = None,
    kv_win: Optional[KVPair] = None,
    q_offset: int = 0,
    backend: Optional[str] = None,
    return_block_idx: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Native Sparse Attention: ``o = g_cmp*o_cmp + g_slc*o_slc + g_win*o_win``.

    Blocks are selected from the compressed branch's attention probabilities
    (:func:`nsa.ops.select_blocks`); the selected branch reads raw ``(k, v)``.
    With a gradient and every op on Triton, the call is one autograd Function
    (:mod:`nsa.ops.training`) whose backward shares work between the branches; the
    result is that of the ops composed, up to the order of gradient sums.

    Args:
        q: ``[B, T, HQ, Dk]``.
        k: ``[B, Tk, H, Dk]`` raw keys of the selected branch, ``Tk >= q_offset + T``.
        v: ``[B, Tk, H, Dv]``.
        gates: ``[B, T, HQ, 3]`` in ``[0, 1]``, order (cmp, slc, win).
        config: block geometry and scale.
        kv_cmp: ``(k_cmp [B, Nc, H, Dk], v_cmp [B, Nc, H, Dv])`` already compressed;
            default: :func:`nsa.ops.mean_compress` of ``(k, v)``.
        kv_win: raw ``(k, v)`` of the sliding branch; default ``(k, v)``.
        q_offset: position of the first query (see the ops).
        backend: passed to every op: ``None``/``"auto"``, ``"reference"`` or ``"triton"``.
        return_block_idx: also return the selected blocks.
        cu_seqlens: packed variable-length batch: ``q``, ``k``, ``v``, ``gates`` (and
            ``kv_win``) are ``[1, total, ...]`` holding sequences ``i`` at
            ``cu_seqlens[i] : cu_seqlens[i + 1]``, each from position 0 (int32/int64
            ``[N + 1]``, rising from 0 to ``total``); see :mod:`nsa.ops.varlen`.
            Not with ``kv_cmp`` or a ``q_offset``. On the host (a CPU tensor) it keeps
            the call free of any wait for the GPU; on the GPU it is read back once a call.
        max_seqlen: as in flash-attn, at least the longest sequence of the pack (checked; the
            padded lengths come from the pack itself, one batch per length class).

    Returns:
        ``o [B, T, HQ, Dv]`` in q's dtype; with ``return_block_idx``, the pair
        ``(o, block_idx)`` with int32 ``block_idx [B, T, H, sel_count]``.
    """
    check_arguments(q, k, v, gates, config)
    if cu_seqlens is not None:
        return _packed(q, k, v, gates, config, kv_cmp, kv_win, q_offset, backend, return_block_idx, cu_seqlens, max_seqlen)
    if max_seqlen is not None:
        raise ValueError("max_seqlen is given without cu_seqlens; it only describes a packed batch")
    k_cmp, v_cmp = _check_pair("kv_cmp", kv_cmp, q, v) if kv_cmp is not None else (
        mean_compress(k, config, backend=backend),
        mean_compress(v, config, backend=backend),
    )
    k_win, v_win = _check_pair("kv_win", kv_win, q, v) if kv_win is not None else (k, v)
    training = needs_grad(q, k, v, gates, k_cmp, v_cmp, k_win, v_win) and q.shape[1]
    if training and _on_triton(TRAINING_OPS, q, v, backend):
        from nsa.ops.training import nsa_attention_training

        own_win = (k_win, v_win) if kv_win is not None else (None, None)
        o, block_idx = nsa_attention_training(q, k, v, gates, k_cmp, v_cmp, *own_win, config, q_offset)
        return (o, block_idx) if return_block_idx else o
    o, block_idx = composed_branches(q, k, v, gates, k_cmp, v_cmp, k_win, v_win, config, q_offset, backend)
    return (o, block_idx) if return_block_idx else o


def check_arguments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, config: NSAConfig,
                    kv_cmp: Optional[KVPair] = None, kv_win: Optional[KVPair] = None) -> None:
    """:func:`nsa_attention`'s checks of its arguments (``kv_cmp``/``kv_win`` where given)."""
    _guards.check_config(config)
    _guards.check_attention_inputs(q, k, v)
    _guards.check_gates(gates, q)
    for name, pair in (("kv_cmp", kv_cmp), ("kv_win", kv_win)):
        if pair is not None:
            _check_pair(name, pair, q, v)


def composed_branches(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, k_cmp: torch.Tensor,
    v_cmp: torch.Tensor, k_win: torch.Tensor, v_win: torch.Tensor, config: NSAConfig, q_offset: int,
    backend: Optional[str],
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(o, block_idx)`` of :func:`nsa_attention` from the ops one after the other, each with
    its own autograd Function: its path whenever :mod:`nsa.ops.training` does not apply (and
    what that Function is compared with)."""
    o_cmp, block_idx = _compressed_and_blocks(q, k_cmp, v_cmp, config, q_offset, backend)
    shared = k_win is k and v_win is v
    if shared and q.shape[1] and not needs_grad(q, k, v, gates, o_cmp) and _forced_in_window(q, k, v, config, q_offset, backend):
        return _window_then_selected(q, k, v, gates, o_cmp, block_idx, config, q_offset), block_idx
    o_slc = selected_attention(q, k, v, block_idx, config, q_offset=q_offset, backend=backend)
    return _window_and_gated_sum(q, k_win, v_win, gates, o_cmp, o_slc, config, q_offset, backend), block_idx


def _forced_in_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: NSAConfig, q_offset: int,
                      backend: Optional[str]) -> bool:
    """Whether the window kernel can compute the selected branch's forced blocks here
    (:func:`nsa.ops.window.kernel.forced_in_window`; the caller knows that both branches read
    ``(k, v)`` and that the block lists are the NSA selection's)."""
    if not _on_triton(("selected", "window", "gates"), q, v, backend):
        return False
    from nsa.ops.window.kernel import forced_in_window

    return forced_in_window(config, q.shape[2] // k.shape[2], q_offset)


def _window_then_selected(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, o_cmp: torch.Tensor,
    block_idx: torch.Tensor, config: NSAConfig, q_offset: int,
) -> torch.Tensor:
    """The gated sum of the branches, the window before the selected branch (inference).

    The window kernel also leaves the selected branch's result over its forced blocks (whose
    local keys it reads anyway), the selected kernel starts from it and writes the gated sum:
    neither ``o_slc`` nor a forced-block kernel's launch reaches memory or the GPU.
    """
    from nsa.ops._triton.attention import last_dim_contiguous
    from nsa.ops.selected.kernel import selected_fwd_summed
    from nsa.ops.window.kernel import window_fwd_forced

    _guards.check_q_offset(q_offset, q, k.shape[1])
    q, k, v = (last_dim_contiguous(x) for x in (q, k, v))
    scale = config.softmax_scale(q.shape[-1])
    o_win, _, o_frc, lse_frc = window_fwd_forced(q, k, v, config, scale, q_offset)
    return selected_fwd_summed(q, k, v, block_idx.contiguous(), config.sel_block, scale, q_offset, gates, o_cmp,
                               o_win, forced=(config.init_blocks, config.local_blocks), start=(o_frc, lse_frc),
                               keep=False)[0]


def _window_and_gated_sum(
    q: torch.Tensor, k_win: torch.Tensor, v_win: torch.Tensor, gates: torch.Tensor, o_cmp: torch.Tensor,
    o_slc: torch.Tensor, config: NSAConfig, q_offset: int, backend: Optional[str],
) -> torch.Tensor:
    """The window branch and the gated sum of all three.

    When both ops route to Triton and no gradient is needed, the window kernel sums the
    branches as it writes its output, so ``o_win`` never reaches memory and the separate
    pass over all three outputs goes away (same result, bitwise). Training keeps them
    apart: the gates' gradient needs ``o_win``.
    """
    if not needs_grad(q, k_win, v_win, gates, o_cmp, o_slc) and _on_triton(("window", "gates"), q, v_win, backend):
        _guards.check_attention_inputs(q, k_win, v_win, ("q", "k_win", "v_win"))
        _guards.check_q_offset(q_offset, q, k_win.shape[1])
        from nsa.ops.window.kernel import window_gated_sum

        return window_gated_sum(q, k_win, v_win, gates, o_cmp, o_slc, config, config.softmax_scale(q.shape[-1]), q_offset)
    o_win = sliding_window_attention(q, k_win, v_win, config, q_offset=q_offset, backend=backend)
    return combine_branches(gates, o_cmp, o_slc, o_win, backend=backend)


def _packed(q, k, v, gates, config, kv_cmp, kv_win, q_offset, backend, return_block_idx, cu_seqlens, max_seqlen):
    """:func:`nsa_attention` of a packed batch, run as padded batches of length classes (see
    :mod:`nsa.ops.varlen`)."""
    if kv_cmp is not None:
        raise ValueError("kv_cmp cannot be combined with cu_seqlens: compressed tokens are made per sequence "
                         "inside nsa_attention; pass raw (k, v) instead")
    if q_offset != 0:
        raise ValueError(f"with cu_seqlens every sequence starts at position 0; q_offset must be 0, got {q_offset!r}")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"with cu_seqlens k must be packed like q: {q.shape[1]} positions, got {k.shape[1]}")
    if kv_win is not None:
        _check_pair("kv_win", kv_win, q, v)
        if kv_win[0].shape[1] != q.shape[1]:
            raise ValueError(f"with cu_seqlens kv_win must be packed like q: {q.shape[1]} positions, got {kv_win[0].shape[1]}")
    pack = varlen.layout(cu_seqlens, max_seqlen, q.shape[1], q.shape[0], q.device)
    qs, ks, vs, gs = (pack.pad(x) for x in (q, k, v, gates))
    wins = list(zip(*(pack.pad(x) for x in kv_win))) if kv_win is not None else [None] * len(pack.groups)
    # one padded batch per length class
    outs, blocks = zip(*(nsa_attention(*x, config, kv_win=win, backend=backend, return_block_idx=True)
                         for *x, win in zip(qs, ks, vs, gs, wins)))
    o = pack.unpad(list(outs))
    return (o, pack.unpad(list(blocks))) if return_block_idx else o
