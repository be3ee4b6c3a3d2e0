"""Gates given as the projection that makes them, for ops that can compute them where they use them.

:class:`GateProjection` ``(x, weight, bias)`` stands for ``sigmoid(x @ weight.T + bias)``, the
gates of :class:`nsa.NSAAttention` (``[B, T, 3 * HQ]``, viewed ``[B, T, HQ, 3]``).
:func:`nsa.ops.nsa_decode` takes one in place of the gates tensor: its Triton combine launch then
computes each head's three gates from the hidden state before it waits for the launch before it,
where a decode step otherwise ran a product and a sigmoid of their own (about 7 us of a captured
step's kernel time, H200, session 40; docs/perf/compile.md). Values are rounded where the modules
round them (the logits as ``nn.Linear`` returns them, then the sigmoid), so the gates differ from
the modules' only in the product's order of summation.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F


class GateProjection(NamedTuple):
    """``x [B, T, hidden]``, ``weight [3 * HQ, hidden]``, ``bias [3 * HQ]`` or None, one dtype."""

    x: torch.Tensor
    weight: torch.Tensor
    bias: Optional[torch.Tensor]

    def evaluate(self, heads: int) -> torch.Tensor:
        """The gates ``[B, T, heads, 3]``, as the modules compute them."""
        B, T, _ = self.x.shape
        return torch.sigmoid(F.linear(self.x, self.weight, self.bias)).view(B, T, heads, 3)

    def tensors(self):
        """The tensors it holds (for device, dtype and autograd checks)."""
        return tuple(t for t in self if t is not None)
