"""nsa: Native Sparse Attention for PyTorch (reference ops, Triton kernels, module with KV cache).

See ``NSA_SPEC.md`` semantics in the README. Public API::

    NSAConfig, nsa_attention, ops, NSAAttention, NSACache
"""

from nsa import flags, ops
from nsa.config import NSAConfig
from nsa.modules import DecodeGraph, NSAAttention, NSACache
from nsa.ops import nsa_attention

__version__ = "0.1.0"

# A misspelt NSA_ variable would otherwise be ignored silently.
flags.warn_unknown()

__all__ = ["DecodeGraph", "NSAAttention", "NSACache", "NSAConfig", "nsa_attention", "ops", "__version__"]
