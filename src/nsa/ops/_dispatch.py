"""Public op -> implementation: asks the router, then imports the chosen module.

Each op folder holds ``reference.py`` and, once it exists, ``kernel.py``; both
expose the implementation under the same function name, so the public op names
one function and the router picks the module.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

import torch

_MODULE_OF_BACKEND = {"reference": "reference", "triton": "kernel"}


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether a call on ``tensors`` records autograd: grad mode on and one of them requires
    a gradient. Decides between an autograd Function (which saves tensors for backward) and
    a plain forward, and where a path has no backward, whether it must refuse the call."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def implementation(op: str, fn: str, like: torch.Tensor, backend: Optional[str],
                   head_dim: Optional[int] = None) -> Callable:
    """The function ``fn`` of the backend that routing picks for ``op`` on ``like``'s device and
    dtype, for heads ``head_dim`` wide (the wider of its key and value heads, where its tiles
    depend on it)."""
    # Imported here, not at module level: ``import nsa`` must not load nsa.routing, or
    # ``python -m nsa.routing`` would execute a module that is already imported.
    from nsa import routing

    route = routing.resolve(op, like.device, like.dtype, backend, head_dim)
    module = importlib.import_module(f"nsa.ops.{op}.{_MODULE_OF_BACKEND[route.backend]}")
    return getattr(module, fn)
