"""NSAConfig: the one typed home of NSA's structural hyper-parameters.

Symbols follow ``NSA_SPEC.md``: ``l = cmp_block``, ``d = cmp_stride``,
``l' = sel_block``, ``n = sel_count``, ``w = window``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional


@dataclass(frozen=True)
class NSAConfig:
    """Block geometry of Native Sparse Attention (paper defaults).

    Args:
        cmp_block: ``l``, raw tokens pooled into one compressed token. Default 32.
        cmp_stride: ``d``, distance between consecutive compressed tokens; must
            divide ``cmp_block`` and ``sel_block``. Default 16.
        sel_block: ``l'``, tokens per selection block. Default 64.
        sel_count: ``n``, selected blocks per query and KV group, counting the
            forced initial and local blocks. Default 16.
        init_blocks: leading blocks every query selects (attention sinks). Default 1.
        local_blocks: blocks ending at the query's own block that every query
            selects. Default 2.
        window: ``w``, sliding-window length, the query itself included. Default 512.
        scale: softmax scale; ``None`` means ``1 / sqrt(Dk)``.

    Raises:
        ValueError: naming the field, for non-positive sizes, a stride that does
            not divide ``cmp_block`` or ``sel_block``, or ``sel_count`` smaller
            than ``init_blocks + local_blocks``.
    """

    cmp_block: int = 32
    cmp_stride: int = 16
    sel_block: int = 64
    sel_count: int = 16
    init_blocks: int = 1
    local_blocks: int = 2
    window: int = 512
    scale: Optional[float] = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "scale":
                if value is not None and (
                    isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0)
                ):
                    raise ValueError(f"NSAConfig.scale must be a positive finite number or None, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"NSAConfig.{f.name} must be an int, got {type(value).__name__} {value!r}")
        for name in ("cmp_block", "cmp_stride", "sel_block", "sel_count", "window"):
            if getattr(self, name) <= 0:
                raise ValueError(f"NSAConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("init_blocks", "local_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"NSAConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.cmp_block % self.cmp_stride:
            raise ValueError(
                f"NSAConfig.cmp_stride={self.cmp_stride} must divide cmp_block={self.cmp_block}"
            )
        if self.sel_block % self.cmp_stride:
            raise ValueError(
                f"NSAConfig.cmp_stride={self.cmp_stride} must divide sel_block={self.sel_block}"
            )
        if self.sel_count < self.init_blocks + self.local_blocks:
            raise ValueError(
                f"NSAConfig.sel_count={self.sel_count} must be >= init_blocks + local_blocks "
                f"= {self.init_blocks} + {self.local_blocks}"
            )

    def softmax_scale(self, head_dim: int) -> float:
        """The configured scale, or ``1 / sqrt(head_dim)``."""
        return float(self.scale) if self.scale is not None else head_dim ** -0.5

    def num_cmp(self, seq_len: int) -> int:
        """Compressed tokens complete within the first ``seq_len`` positions.

        Equals the spec's ``Nc(t)`` for ``t = seq_len - 1``.
        """
        if seq_len < self.cmp_block:
            return 0
        return (seq_len - self.cmp_block) // self.cmp_stride + 1

    def num_sel_blocks(self, seq_len: int) -> int:
        """Selection blocks that intersect the first ``seq_len`` positions."""
        return -(-seq_len // self.sel_block)

    def decode_reads(self, context: int) -> int:
        """Tokens one decode step reads at ``context`` when every selected block is full.

        ``Nc(S-1) + min(n*l', S) + min(w, S)``: the spec's "Decode memory reads"
        formula, counting a position read by two branches twice. Real steps may
        read fewer selected tokens when the query's own block is partial; the
        decode path counts those from the actual selected blocks.
        """
        return self.num_cmp(context) + min(self.sel_count * self.sel_block, context) + min(self.window, context)
