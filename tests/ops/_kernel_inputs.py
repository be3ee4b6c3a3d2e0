"""Inputs and checks shared by the attention-kernel tests (selected, window, compressed, selection)."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch

#: Real-size bf16 GPU cases: the paper's heads, one KV head per query head, Dk = 192 / Dv = 128.
GPU_SHAPES = pytest.mark.parametrize(
    "T, HQ, H, DK, DV",
    [(4099, 64, 4, 128, 128), (3001, 16, 16, 128, 128), (2053, 16, 1, 192, 128)],
    ids=["T4099-HQ64-H4-D128", "T3001-G1-D128", "T2053-G16-DK192-DV128"],
)


def qkv(B, T, HQ, H, DK, DV, dtype, device, TK=None):
    """Random ``q [B, T, HQ, DK]``, ``k [B, TK, H, DK]``, ``v [B, TK, H, DV]`` (TK defaults to T)."""
    TK = T if TK is None else TK
    q = torch.randn(B, T, HQ, DK, device=device, dtype=dtype)
    k = torch.randn(B, TK, H, DK, device=device, dtype=dtype)
    v = torch.randn(B, TK, H, DV, device=device, dtype=dtype)
    return q, k, v


def nsa_run(q, k, v, gates, config, backend, do, block_idx=None):
    """``(o, block_idx, [dq, dk, dv, dgates])`` of :func:`nsa.nsa_attention` for the upstream
    gradient ``do`` (float64). Given ``block_idx``, the reference selects those blocks instead of
    its own (:func:`nsa.testing.nsa_attention_with_blocks`; ``backend`` is then unused)."""
    from nsa import nsa_attention
    from nsa.testing import nsa_attention_with_blocks

    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, gates)]
    if block_idx is None:
        o, block_idx = nsa_attention(*leaves, config, backend=backend, return_block_idx=True)
    else:
        o = nsa_attention_with_blocks(*leaves, config, block_idx)
    (o.double() * do).sum().backward()
    return o, block_idx, [x.grad for x in leaves]


def nsa_forward_backward(q, k, v, gates, config, backend, do):
    """``[o, dq, dk, dv, dgates]`` of :func:`nsa_run`."""
    o, _, grads = nsa_run(q, k, v, gates, config, backend, do)
    return [o] + grads


def assert_bitwise_repeatable(run):
    """``run()`` twice gives bitwise-equal tensors: the deterministic-backward promise."""
    for a, b in zip(run(), run()):
        assert torch.equal(a, b)


def spy_launches(monkeypatch, module, name, *keys):
    """Replace the Triton kernel ``module.name`` by one that runs it and records, for every launch,
    its launch argument ``keys[0]`` (or the tuple of ``keys``); returns that list."""
    launched = []
    real = getattr(module, name)

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                launched.append(meta[keys[0]] if len(keys) == 1 else tuple(meta[key] for key in keys))
                return real[grid](*args, **meta)

            return launch

    monkeypatch.setattr(module, name, Spy())
    return launched


@contextlib.contextmanager
def every_launch() -> Iterator[List[Tuple[str, Dict[str, Any]]]]:
    """Record every Triton launch inside the block, as ``(kernel name, keyword arguments)``: the
    constexprs and launch options (``num_warps``, ``num_stages``) that the launcher passed by
    keyword, and the positional arguments under ``"args"``."""
    from nsa.ops.window.kernel import window_fwd_kernel

    kernel_type = type(window_fwd_kernel)  # JITFunction on a GPU, InterpretedFunction under the interpreter
    real_run = kernel_type.run
    launches: List[Tuple[str, Dict[str, Any]]] = []

    def run(self, *args, **kwargs):
        launches.append((self.fn.__name__, dict(kwargs, args=args)))
        return real_run(self, *args, **kwargs)

    kernel_type.run = run
    try:
        yield launches
    finally:
        kernel_type.run = real_run
