"""Inputs and checks shared by the attention-kernel tests (selected, window, compressed, selection)."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch

from nsa import NSAConfig

#: Real-size bf16 GPU cases: the paper's heads, one KV head per query head, Dk = 192 / Dv = 128.
#: The real sizes the per-op GPU tests take, by id.
GPU_SHAPE_CASES = {"T4099-HQ64-H4-D128": (4099, 64, 4, 128, 128), "T3001-G1-D128": (3001, 16, 16, 128, 128),
                   "T2053-G16-DK192-DV128": (2053, 16, 1, 192, 128)}


def gpu_shapes():
    """Parametrize ``T, HQ, H, DK, DV`` over :data:`GPU_SHAPE_CASES` (each case peaks under 5 GiB with
    its float32 reference on an H100, session 31: none needs a ``requires(memory_gib=...)``)."""
    cases = [pytest.param(*shape, id=name) for name, shape in GPU_SHAPE_CASES.items()]
    return pytest.mark.parametrize("T, HQ, H, DK, DV", cases)



#: The small geometry of :func:`prefill_and_decode_launches`: every block size below the 40 tokens.
LAUNCH_CONFIG = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)


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


def reference_selection(q, k, config):
    """The reference's blocks and its block scores (:func:`nsa.testing.block_scores`) for queries
    ``q`` and raw keys ``k`` (mean-compressed by the reference), in their dtype: what
    :func:`nsa.testing.assert_valid_selection` checks an implementation's blocks against."""
    from nsa.ops import mean_compress, select_blocks
    from nsa.testing import block_scores

    k_cmp = mean_compress(k, config, backend="reference")
    return select_blocks(q, k_cmp, config, backend="reference"), block_scores(q, k_cmp, config)


def nsa_forward_backward(q, k, v, gates, config, backend, do):
    """``[o, dq, dk, dv, dgates]`` of :func:`nsa_run`."""
    o, _, grads = nsa_run(q, k, v, gates, config, backend, do)
    return [o] + grads


def assert_bitwise_repeatable(run):
    """``run()`` twice gives bitwise-equal tensors: the deterministic-backward promise."""
    for a, b in zip(run(), run()):
        assert torch.equal(a, b)


def spy_launches(monkeypatch, module, name, *keys):
    """Record, for every launch of the Triton kernel ``module.name`` until the test ends, its launch
    argument ``keys[0]`` (or the tuple of ``keys``); returns that list."""
    launched = []

    def record(kernel, kwargs):
        if kernel == name:
            launched.append(kwargs[keys[0]] if len(keys) == 1 else tuple(kwargs[key] for key in keys))

    kernel_type = type(getattr(module, name))
    monkeypatch.setattr(kernel_type, "run", _recording_run(kernel_type.run, record))
    return launched


@contextlib.contextmanager
def every_launch(execute: bool = True) -> Iterator[List[Tuple[str, Dict[str, Any]]]]:
    """Record every Triton launch inside the block, as ``(kernel name, keyword arguments)``: the
    constexprs and launch options (``num_warps``, ``num_stages``) that the launcher passed by
    keyword, and the positional arguments under ``"args"``. ``execute=False`` records the launches
    without running them, for tests of the launchers' choices alone: outputs are then whatever
    their buffers held, so only launch choices that depend on shapes are meaningful."""
    from nsa.ops.window.forward import window_fwd_kernel

    kernel_type = type(window_fwd_kernel)  # JITFunction on a GPU, InterpretedFunction under the interpreter
    real_run = kernel_type.run
    launches: List[Tuple[str, Dict[str, Any]]] = []
    run = real_run if execute else (lambda *args, **kwargs: None)
    kernel_type.run = _recording_run(run, lambda kernel, kwargs: launches.append((kernel, kwargs)))
    try:
        yield launches
    finally:
        kernel_type.run = real_run


def prefill_and_decode_launches(device, DK: int, DV: int, dtype: torch.dtype = torch.float32,
                                execute: bool = True) -> List[Tuple[str, Dict[str, Any]]]:
    """Every launch (:func:`every_launch`) of a small Triton prefill, forward and backward (T 40,
    4 query heads, 1 KV head, :data:`LAUNCH_CONFIG`), and of one decode step after it. With
    ``execute=False`` nothing runs: only the launch choices count (CPU only, see every_launch)."""
    from nsa.ops import mean_compress
    from nsa.ops.decode import nsa_decode

    q, k, v = qkv(1, 40, 4, 1, DK, DV, dtype, device)
    gates = torch.rand(1, 40, 4, 3, device=device, dtype=dtype)
    do = torch.randn(1, 40, 4, DV, dtype=torch.float64, device=device)
    with every_launch(execute) as launches:
        nsa_forward_backward(q, k, v, gates, LAUNCH_CONFIG, "triton", do)
        kv_cmp = (mean_compress(k, LAUNCH_CONFIG), mean_compress(v, LAUNCH_CONFIG))
        nsa_decode(q[:, -1:], k, v, gates[:, -1:], torch.tensor([40], dtype=torch.int32, device=device),
                   LAUNCH_CONFIG, kv_cmp=kv_cmp, backend="triton")
    return launches


def _recording_run(real_run, record):
    """A ``run`` for Triton's kernel type (every launch goes through it) that passes
    ``record(kernel name, keyword arguments with the positional ones under "args")`` each launch,
    then launches as ``real_run`` does."""

    def run(self, *args, **kwargs):
        record(self.fn.__name__, dict(kwargs, args=args))
        return real_run(self, *args, **kwargs)

    return run
