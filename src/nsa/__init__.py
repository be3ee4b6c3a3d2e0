"""nsa: Native Sparse Attention for PyTorch (reference ops, Triton kernels, module with KV cache).

See ``NSA_SPEC.md`` semantics in the README. Public API::

    NSAConfig, nsa_attention, ops, NSAAttention, NSACache, DecodeGraph

``import nsa`` loads only the flags and the config. The ops and the modules (with torch and the
``torch.compile`` machinery that marks the ops: seconds) load when one of their names is first
used, so what needs only the flags stays cheap: pytest_nsa, which the ``pytest11`` entry point
loads into every pytest run, whether its options are given or not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, List

from nsa import flags
from nsa.config import NSAConfig

if TYPE_CHECKING:
    from nsa import ops
    from nsa.modules import DecodeGraph, NSAAttention, NSACache
    from nsa.ops import nsa_attention

__version__ = "0.1.0"

# A misspelt NSA_ variable would otherwise be ignored silently.
flags.warn_unknown()

__all__ = ["DecodeGraph", "NSAAttention", "NSACache", "NSAConfig", "nsa_attention", "ops", "__version__"]

#: Public names loaded on first use, and the module of each (``ops``, as any submodule, is its own).
_LAZY = {"nsa_attention": "nsa.ops", "DecodeGraph": "nsa.modules", "NSAAttention": "nsa.modules",
         "NSACache": "nsa.modules"}  # fmt: skip


def __getattr__(name: str) -> Any:
    """A public name of :data:`_LAZY`, or a submodule (``nsa.ops``, ``nsa.testing``), imported on first
    use and then kept as an attribute like any other."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name.startswith("__"):  # tools probe modules for dunders (__test__, __wrapped__): no import
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))
