"""The reference at long context on a GPU: T = 64k without any T x T tensor.

One float32 T x T score matrix of a single head is 16 GiB at 64k, and the reference's
whole-sequence float32 intermediates (the upcast queries, three branch outputs) are of
that order too, so an absolute bound says little. The growth does: from 16k to 64k a
reference that is linear in T grows its peak about 4x, one with a T x T term 16x.
"""

from __future__ import annotations

import pytest
import torch

from nsa import NSAConfig, nsa_attention


def _reference_peak(T: int, device: torch.device) -> int:
    HQ, H, D = 64, 4, 128
    q = torch.randn(1, T, HQ, D, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, T, H, D, device=device, dtype=torch.bfloat16) for _ in range(2))
    gates = torch.rand(1, T, HQ, 3, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        o = nsa_attention(q, k, v, gates, NSAConfig(), backend="reference")
    peak = torch.cuda.max_memory_allocated(device) - before
    assert torch.isfinite(o).all()
    return peak


@pytest.mark.gpu
@pytest.mark.long_context
@pytest.mark.requires(memory_gib=12)  # 9.5 GiB at 64k (H100, session 31)
def test_reference_memory_grows_linearly_to_64k(nsa_device):
    short = _reference_peak(16384, nsa_device)
    long = _reference_peak(65536, nsa_device)
    growth = long / short
    assert growth < 8, f"reference peak grew {growth:.1f}x from 16k ({short / 2**30:.1f} GiB) to 64k ({long / 2**30:.1f} GiB)"
    assert long < 32 * 2**30, f"reference peaked at {long / 2**30:.1f} GiB at 64k"
