"""Argument checks for the public ops: each error names the argument and the shapes.

Only public ops call these; kernels and references trust their inputs.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from nsa import flags
from nsa.config import NSAConfig

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def check_config(config: object) -> NSAConfig:
    if not isinstance(config, NSAConfig):
        raise TypeError(f"config must be an nsa.NSAConfig, got {type(config).__name__}")
    return config


def check_tensor(name: str, t: object, rank: int = 4, floating: bool = True) -> torch.Tensor:
    """``t`` is a tensor of ``rank``, and a float (or index) dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dims, got {t.dim()} with shape {_shape(t)}")
    allowed = FLOAT_DTYPES if floating else INDEX_DTYPES
    if t.dtype not in allowed:
        kinds = "float16/bfloat16/float32/float64" if floating else "int32/int64"
        raise TypeError(f"{name} must be {kinds}, got {t.dtype}")
    return t


def check_same(names: Sequence[str], tensors: Sequence[torch.Tensor], *, dtype: bool = True) -> None:
    """All tensors share a device (and, with ``dtype``, a dtype)."""
    first_name, first = names[0], tensors[0]
    for name, t in zip(names[1:], tensors[1:]):
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; move them to one device")
        if dtype and t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}; use one dtype")


def check_attention_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, names: Sequence[str] = ("q", "k", "v")
) -> None:
    """q ``[B, Tq, HQ, Dk]``, k ``[B, Tk, H, Dk]``, v ``[B, Tk, H, Dv]`` with H | HQ."""
    nq, nk, nv = names
    for name, t in zip(names, (q, k, v)):
        check_tensor(name, t)
    check_same(names, (q, k, v))
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch sizes differ: {nq} {_shape(q)}, {nk} {_shape(k)}, {nv} {_shape(v)}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"{nk} {_shape(k)} and {nv} {_shape(v)} must have the same length (dim 1)")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"{nk} {_shape(k)} and {nv} {_shape(v)} must have the same number of heads (dim 2)")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"head dims differ: {nq} {_shape(q)} has Dk={q.shape[3]}, {nk} {_shape(k)} has {k.shape[3]}")
    if k.shape[2] == 0 or q.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(
            f"query heads HQ={q.shape[2]} ({nq} {_shape(q)}) must be a positive multiple of KV heads H={k.shape[2]} "
            f"({nk} {_shape(k)})"
        )


def check_q_offset(q_offset: object, q: torch.Tensor, keys_len: Optional[int], key_name: str = "k") -> int:
    """``q_offset`` is an int >= 0 and, for raw keys, queries end within the keys."""
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ValueError(f"q_offset must be an int >= 0, got {q_offset!r}")
    if keys_len is not None and q_offset + q.shape[1] > keys_len:
        raise ValueError(
            f"queries cover positions {q_offset}..{q_offset + q.shape[1] - 1} but {key_name} has only "
            f"{keys_len} positions (q_offset={q_offset}, q length {q.shape[1]})"
        )
    return q_offset


def check_gates(gates: object, q: torch.Tensor) -> torch.Tensor:
    g = check_tensor("gates", gates)
    want = (q.shape[0], q.shape[1], q.shape[2], 3)
    if tuple(g.shape) != want:
        raise ValueError(f"gates must have shape [B, T, HQ, 3] = {list(want)}, got {_shape(g)}")
    check_same(("q", "gates"), (q, g), dtype=False)
    return g


def check_gate_projection(gates: object, q: torch.Tensor) -> None:
    """``gates``, a :class:`nsa.ops.gates.projection.GateProjection`: ``x [B, T, hidden]`` of q's
    B and T, ``weight [3 * HQ, hidden]``, ``bias [3 * HQ]`` or None, contiguous, of one floating
    dtype, on q's device."""
    x, weight, bias = gates
    check_tensor("gates.x", x, rank=3)
    B, T, HQ = q.shape[:3]
    want = {"gates.x": (x, (B, T, x.shape[2])), "gates.weight": (weight, (3 * HQ, x.shape[2])),
            "gates.bias": (bias, (3 * HQ,))}  # fmt: skip
    for name, (t, shape) in want.items():
        if t is None and name == "gates.bias":
            continue
        check_tensor(name, t, rank=len(shape))
        if tuple(t.shape) != shape or t.dtype != x.dtype or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {x.dtype} tensor of shape {list(shape)}, "
                             f"got {t.dtype} {_shape(t)}")  # fmt: skip
        check_same(("q", name), (q, t), dtype=False)


def check_block_idx(block_idx: object, q: torch.Tensor, k: torch.Tensor, config: NSAConfig) -> torch.Tensor:
    """block_idx ``[B, Tq, H, m]`` of int32/int64 with values in ``[-1, ceil(Tk / sel_block))``.

    Values are checked according to ``NSA_CHECK_INDICES`` (on CPU tensors by
    default; on CUDA the check is a device sync, so it runs only when asked).
    """
    idx = check_tensor("block_idx", block_idx, floating=False)
    want = (q.shape[0], q.shape[1], k.shape[2])
    if tuple(idx.shape[:3]) != want or idx.shape[3] == 0:
        raise ValueError(f"block_idx must have shape [B, Tq, H, count] with [B, Tq, H] = {list(want)}, got {_shape(idx)}")
    check_same(("q", "block_idx"), (q, idx), dtype=False)
    mode = flags.get("NSA_CHECK_INDICES")
    if mode == "on" or (mode == "auto" and idx.device.type == "cpu"):
        limit = config.num_sel_blocks(k.shape[1])
        if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= limit):
            raise ValueError(
                f"block_idx values must lie in [-1, {limit - 1}] for {k.shape[1]} key positions and "
                f"sel_block={config.sel_block}; got min {int(idx.min())}, max {int(idx.max())}"
            )
    return idx
