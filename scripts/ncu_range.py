"""The profiled range of the ``ncu_*.py`` scripts (run them under ``ncu --profile-from-start off``)."""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import torch

from nsa import NSAConfig
from nsa.ops import mean_compress


def profile_once(calls: Sequence[Callable[[], object]], warmup: int = 1) -> None:
    """Run each call ``warmup`` times (compilation, autotuning), then each once between
    cudaProfilerStart and cudaProfilerStop, so that Nsight Compute sees one launch set."""
    for call in calls:
        for _ in range(warmup):
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def compressed_inputs(length: int) -> Tuple[NSAConfig, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """``(config, q, k_cmp, v_cmp, scale)`` of the compressed branch at ``length`` tokens, seeded by it:
    bf16, B = 1, 64 query heads, 4 KV heads, head dim 128, paper defaults, random inputs."""
    config = NSAConfig()
    torch.manual_seed(length)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(1, length, heads, 128, **bf) for heads in (64, 4, 4))
    return config, q, mean_compress(k, config), mean_compress(v, config), config.softmax_scale(128)
