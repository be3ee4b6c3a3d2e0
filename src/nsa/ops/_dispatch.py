"""Public op -> implementation: asks the router, then imports the chosen module.

Each op folder holds ``reference.py`` and, once it exists, ``kernel.py``; both
expose the implementation under the same function name, so the public op names
one function and the router picks the module. :func:`public_op` marks each public op
for ``torch.compile``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

import torch

_MODULE_OF_BACKEND = {"reference": "reference", "triton": "kernel"}

Op = TypeVar("Op", bound=Callable)


def public_op(fn: Op) -> Op:
    """Mark ``fn`` as a public op: it runs on the GPU that holds its tensors, and Dynamo never
    traces its Python.

    Triton launches on the current CUDA device, not on the device of the pointers it is given,
    so an op on ``cuda:1`` while ``cuda:0`` is current (a model spread over GPUs in one process,
    as ``device_map="auto"`` places it) makes the current device its tensors' own first.

    Traced, its Triton launches would be recompiled by Inductor, which types a kernel's Python
    float arguments as float64 and so fails to compile them (the compressed forward's softmax
    scale turned its running max to float64: ``Loop-carried variable b_m has initial type fp32
    but is re-assigned to fp64``; H200, torch 2.11, Triton 3.6); and Inductor has nothing to fuse
    in kernels that are fused by hand. So under ``torch.compile`` an op that
    :mod:`nsa.ops.library` wraps (same name there) becomes its custom op, one opaque node of the
    graph; any other op runs as itself, eagerly, between the compiled graphs of the code around
    it (a graph break). Either way it returns what it returns without ``torch.compile``."""

    @functools.wraps(fn)
    def on_its_device(*args: Any, **kwargs: Any) -> Any:
        device = cuda_device_of(*args, *kwargs.values())
        if device is None or device.index == torch.cuda.current_device():
            return fn(*args, **kwargs)
        with torch.cuda.device(device):
            return fn(*args, **kwargs)

    # a submodule import: nsa.ops may still be importing (library needs only nsa.config at import)
    traced = getattr(importlib.import_module("nsa.ops.library"), fn.__name__, None)
    reason = (f"{fn.__name__} runs eagerly here: a packed batch (cu_seqlens), or a gradient on a route that is "
              f"not Triton's throughout (nsa.ops.library)") if traced else (
              f"{fn.__name__} runs eagerly under torch.compile; only nsa_attention, mean_compress, "
              f"nsa_decode and apply_rotary are custom ops (nsa.ops.library)")  # fmt: skip
    eager = torch.compiler.disable(on_its_device, recursive=True, **_reason(reason))
    if traced is None:
        return eager  # type: ignore[return-value]

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            result = traced(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return eager(*args, **kwargs)

    return op  # type: ignore[return-value]


def _reason(text: str) -> dict:
    """``reason=text`` where ``torch.compiler.disable`` takes it (torch 2.8 on): Dynamo prints it
    when ``fullgraph=True`` refuses the graph break."""
    return {"reason": text} if "reason" in inspect.signature(torch.compiler.disable).parameters else {}


def cuda_device_of(*values: Any) -> Optional[torch.device]:
    """The device of the first CUDA tensor among ``values`` (tensors or pairs of them), if any."""
    for value in values:
        for t in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(t, torch.Tensor) and t.is_cuda:
                return t.device
    return None


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether a call on ``tensors`` records autograd: grad mode on and one of them requires
    a gradient. Decides between an autograd Function (which saves tensors for backward) and
    a plain forward, and where a path has no backward, whether it must refuse the call."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def implementation(op: str, fn: str, like: torch.Tensor, backend: Optional[str],
                   head_dim: Optional[Union[int, Tuple[int, int]]] = None) -> Callable:
    """The function ``fn`` of the backend that routing picks for ``op`` on ``like``'s device and
    dtype, for heads ``head_dim`` wide (``(Dk, Dv)``, or one width for both, where its tiles
    depend on them; :data:`nsa.routing.HeadDims`)."""
    return route(op, fn, like.device, like.dtype, backend, head_dim)


def route(op: str, fn: str, device: torch.device, dtype: torch.dtype, backend: Optional[str],
          head_dim: Optional[Union[int, Tuple[int, int]]] = None) -> Callable:
    """:func:`implementation` for an op whose inputs do not carry the routed dtype (the rotary
    tables: integer positions in, ``dtype`` out)."""
    # Imported here, not at module level: ``import nsa`` must not load nsa.routing, or
    # ``python -m nsa.routing`` would execute a module that is already imported.
    from nsa import routing

    chosen = routing.resolve(op, device, dtype, backend, head_dim)
    module = importlib.import_module(f"nsa.ops.{op}.{_MODULE_OF_BACKEND[chosen.backend]}")
    return getattr(module, fn)
