"""The reference at long context on a GPU: T = 64k without any T x T tensor."""

from __future__ import annotations

import pytest
import torch

from nsa import NSAConfig, nsa_attention


@pytest.mark.gpu
@pytest.mark.long_context
@pytest.mark.requires(memory_gib=40)
def test_reference_runs_64k_in_bounded_memory(nsa_device):
    T, HQ, H, D = 65536, 64, 4, 128
    q = torch.randn(1, T, HQ, D, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, T, H, D, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    gates = torch.rand(1, T, HQ, 3, device=nsa_device, dtype=torch.bfloat16)
    torch.cuda.reset_peak_memory_stats(nsa_device)
    before = torch.cuda.memory_allocated(nsa_device)
    with torch.no_grad():
        o = nsa_attention(q, k, v, gates, NSAConfig(), backend="reference")
    peak = torch.cuda.max_memory_allocated(nsa_device) - before
    assert torch.isfinite(o).all()
    # One float32 T x T score matrix of a single head alone would take 16 GiB.
    assert peak < 16 * 2**30, f"reference peaked at {peak / 2**30:.1f} GiB"
