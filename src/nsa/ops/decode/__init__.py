"""Decode: the new token(s) of each sequence attend over a KV cache (all three branches)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from nsa import flags
from nsa.config import NSAConfig
from nsa.ops import _guards
from nsa.ops._dispatch import implementation, needs_grad, public_op
from nsa.ops.gates.projection import GateProjection

KVPair = Tuple[torch.Tensor, torch.Tensor]


def _check_cache(name: str, t: torch.Tensor, q: torch.Tensor, head_dim: Optional[int], heads: int) -> None:
    _guards.check_tensor(name, t)
    _guards.check_same(("q", name), (q, t))
    if t.shape[0] != q.shape[0] or t.shape[2] != heads or (head_dim is not None and t.shape[3] != head_dim):
        want = f"[{q.shape[0]}, capacity, {heads}, {head_dim if head_dim is not None else 'Dv'}]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")


def _check_seq_lens(seq_lens: object, q: torch.Tensor, k: torch.Tensor, k_cmp: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"seq_lens must be an int32 torch.Tensor [B], got {type(seq_lens).__name__}")
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (q.shape[0],):
        raise ValueError(f"seq_lens must be int32 [B] = [{q.shape[0]}], got {seq_lens.dtype} {list(seq_lens.shape)}")
    _guards.check_same(("q", "seq_lens"), (q, seq_lens), dtype=False)
    mode = flags.get("NSA_CHECK_INDICES")
    if mode == "on" or (mode == "auto" and seq_lens.device.type == "cpu"):
        # Reading the values syncs with the device, so on CUDA this runs only when asked.
        lo, hi = int(seq_lens.min()), int(seq_lens.max())
        if lo < q.shape[1] or hi > k.shape[1] or config.num_cmp(hi) > k_cmp.shape[1]:
            raise ValueError(
                f"seq_lens must lie in [Tq, capacity] = [{q.shape[1]}, {k.shape[1]}] with "
                f"num_cmp(seq_lens) <= k_cmp capacity {k_cmp.shape[1]}; got min {lo}, max {hi}"
            )
    return seq_lens


@public_op
def nsa_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: Union[torch.Tensor, GateProjection],
    seq_lens: torch.Tensor,
    config: NSAConfig,
    *,
    kv_cmp: KVPair,
    kv_win: Optional[KVPair] = None,
    backend: Optional[str] = None,
    return_block_idx: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """NSA for the last ``Tq`` tokens of each sequence, reading a preallocated KV cache.

    The cache holds ``seq_lens[b]`` valid positions of sequence ``b``, the new
    tokens included (write them first): query ``i`` of sequence ``b`` sits at
    position ``t = seq_lens[b] - Tq + i``. The result is exactly what
    :func:`nsa.nsa_attention` gives those queries in a prefill of the whole
    sequence (spec identity 3)::

        cache k/v:  | 0 ... t-Tq | new tokens | unused capacity (never read) |
        compressed: tokens j with j*d + l - 1 <= t, i.e. Nc(t) = (t + 1 - l) // d + 1
        selected:   sel_count blocks of sel_block chosen from the compressed scores
        window:     positions t - w < s <= t

    Positions come from the device tensor ``seq_lens``, never from host ints, so
    one captured CUDA graph replays correctly as the lengths grow (the Triton
    path is sync-free; the reference path reads ``seq_lens`` on the host).
    Sequences of a batch may have different lengths. Nothing is written in
    place: emitting compressed tokens and advancing ``seq_lens`` is the
    caller's job (see :class:`nsa.NSACache`). No backward: call it under
    ``torch.no_grad()`` or ``torch.inference_mode()``.

    Args:
        q: ``[B, Tq, HQ, Dk]`` new queries (RoPE applied), float16/bfloat16/float32.
        k: ``[B, capacity, H, Dk]`` raw keys of the selected branch, ``H | HQ``.
        v: ``[B, capacity, H, Dv]``.
        gates: ``[B, Tq, HQ, 3]`` in ``[0, 1]``, order (cmp, slc, win); or a
            :class:`~nsa.ops.gates.projection.GateProjection` ``(x, weight, bias)`` that makes
            them, ``sigmoid(x @ weight.T + bias)`` viewed ``[B, Tq, HQ, 3]``, which the Triton
            path computes in its last launch instead of reading them.
        seq_lens: int32 ``[B]`` on q's device, ``Tq <= seq_lens[b] <= capacity``
            (checked on CPU; on CUDA only with ``NSA_CHECK_INDICES=on``, which syncs).
        config: block geometry and scale (default ``1/sqrt(Dk)``).
        kv_cmp: ``(k_cmp [B, capacity_c, H, Dk], v_cmp [B, capacity_c, H, Dv])``,
            compressed tokens ``0 .. Nc(t) - 1`` already emitted for the last query.
        kv_win: raw ``(k, v)`` of the sliding branch, shaped like ``(k, v)``; default ``(k, v)``.
        backend: ``None``/``"auto"``, ``"reference"`` or ``"triton"`` (flag ``NSA_BACKEND_DECODE``).
        return_block_idx: also return the selected blocks.

    Returns:
        ``o [B, Tq, HQ, Dv]`` in q's dtype; with ``return_block_idx`` the pair
        ``(o, block_idx)`` with int32 ``block_idx [B, Tq, H, sel_count]``
        (ascending, padded with -1), equal to :func:`nsa.ops.select_blocks` in a prefill.

    Raises:
        ValueError/TypeError: naming the argument, for bad shapes, dtypes or devices.
        RuntimeError: if autograd would need a gradient through the op.
    """
    _guards.check_config(config)
    _guards.check_tensor("q", q)
    B, Tq, HQ, Dk = q.shape
    if Tq == 0:
        raise ValueError(f"q must hold at least one new token per sequence, got {list(q.shape)}")
    heads = _guards.check_tensor("k", k).shape[2]
    _check_cache("k", k, q, Dk, heads)
    _check_cache("v", v, q, None, heads)
    Dv = v.shape[3]
    if v.shape[1] != k.shape[1] or heads == 0 or HQ % heads:
        raise ValueError(f"k {list(k.shape)} and v {list(v.shape)} need one capacity and H | HQ={HQ}")
    k_cmp, v_cmp = _pair("kv_cmp", kv_cmp)
    k_win, v_win = _pair("kv_win", kv_win) if kv_win is not None else (k, v)
    for name, t, dim in (("k_cmp", k_cmp, Dk), ("v_cmp", v_cmp, Dv), ("k_win", k_win, Dk), ("v_win", v_win, Dv)):
        _check_cache(name, t, q, dim, heads)
    if k_cmp.shape[1] != v_cmp.shape[1] or k_win.shape[1] != v_win.shape[1] or k_win.shape[1] < k.shape[1]:
        raise ValueError(
            f"k_cmp {list(k_cmp.shape)}/v_cmp {list(v_cmp.shape)} and k_win {list(k_win.shape)}/v_win "
            f"{list(v_win.shape)} need matching capacities, the window's at least k's {k.shape[1]}"
        )
    if isinstance(gates, GateProjection):
        _guards.check_gate_projection(gates, q)
        gate_tensors = gates.tensors()
    else:
        gate_tensors = (_guards.check_gates(gates, q),)
    _check_seq_lens(seq_lens, q, k, k_cmp, config)
    if needs_grad(q, k, v, *gate_tensors, k_cmp, v_cmp, k_win, v_win):
        raise RuntimeError("nsa_decode has no backward; call it under torch.no_grad() or torch.inference_mode()")
    scale = config.softmax_scale(Dk)
    fn = implementation("decode", "nsa_decode", q, backend, (Dk, Dv))
    o, block_idx = fn(q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win, config, scale)
    return (o, block_idx) if return_block_idx else o


def _pair(name: str, pair: object) -> KVPair:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"{name} must be a (k, v) pair of tensors, got {type(pair).__name__}")
    return pair[0], pair[1]


__all__ = ["nsa_decode"]
