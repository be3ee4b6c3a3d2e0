"""The profiled range of the ``ncu_*.py`` scripts (run them under ``ncu --profile-from-start off``)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch


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
