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


def _reference_peak(T: int, device: torch.device, backward: bool) -> int:
    """Peak bytes the reference allocates for one bf16 forward (and backward) at length ``T``."""
    HQ, H, D = 64, 4, 128
    q = torch.randn(1, T, HQ, D, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, T, H, D, device=device, dtype=torch.bfloat16) for _ in range(2))
    gates = torch.rand(1, T, HQ, 3, device=device, dtype=torch.bfloat16)
    do = torch.randn(1, T, HQ, D, device=device, dtype=torch.bfloat16) if backward else None
    leaves = [x.requires_grad_(backward) for x in (q, k, v, gates)]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.set_grad_enabled(backward):
        o = nsa_attention(*leaves, NSAConfig(), backend="reference")
        if backward:
            o.backward(do)
    peak = torch.cuda.max_memory_allocated(device) - before
    assert torch.isfinite(o).all()
    if backward:
        assert all(torch.isfinite(x.grad).all() for x in leaves)
    return peak


@pytest.mark.gpu
@pytest.mark.long_context
@pytest.mark.parametrize(
    "backward",
    [
        pytest.param(False, marks=pytest.mark.requires(memory_gib=12), id="forward"),  # 9.5 GiB at 64k (H100, session 31)
        # each query chunk recomputed in the backward (nsa.ops._reference.map_query_chunks): kept,
        # the chunks' gathered keys would be hundreds of GiB at 64k; 12 s (H100, session 32)
        pytest.param(True, marks=pytest.mark.requires(memory_gib=24), id="forward-backward"),  # 18.0 GiB
    ],
)
def test_reference_memory_grows_linearly_to_64k(backward, nsa_device):
    short = _reference_peak(16384, nsa_device, backward)
    long = _reference_peak(65536, nsa_device, backward)
    growth = long / short
    assert growth < 8, f"reference peak grew {growth:.1f}x from 16k ({short / 2**30:.1f} GiB) to 64k ({long / 2**30:.1f} GiB)"
    assert long < 32 * 2**30, f"reference peaked at {long / 2**30:.1f} GiB at 64k"
