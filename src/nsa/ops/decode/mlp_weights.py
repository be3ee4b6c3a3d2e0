"""The learnable compression's parameters as the decode emission kernels take them: a module of
its own, free of Triton, so that :class:`nsa.modules.MLPCompression` (which hands them over) imports
on machines without Triton (:mod:`nsa.ops.decode.mlp_emission` holds the kernels)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class MLPWeights(NamedTuple):
    """One learnable compression's parameters: ``pos_emb [l, D]``, ``w1 [hidden, l * D]``,
    ``b1 [hidden]``, ``w2 [D, hidden]``, ``b2 [D]`` (the two ``nn.Linear`` layers' weights and
    biases)."""

    pos_emb: torch.Tensor
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
