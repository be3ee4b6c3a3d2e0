"""Long context on a GPU: the reference at 64k without any T x T tensor, and the Triton prefill
against it at 128k.

One float32 T x T score matrix of a single head is 16 GiB at 64k, and the reference's
whole-sequence float32 intermediates (the upcast queries, three branch outputs) are of
that order too, so an absolute bound says little. The growth does: from 16k to 64k a
reference that is linear in T grows its peak about 4x, one with a T x T term 16x.
"""

from __future__ import annotations

import pytest
import torch

from nsa import NSAConfig, nsa_attention
from nsa.ops import mean_compress, select_blocks
from nsa.testing import SELECTION_EPS, assert_close, assert_valid_selection, block_scores, nsa_attention_with_blocks


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


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.long_context
@pytest.mark.requires(memory_gib=56)  # 49.0 GiB, 60 s with the compiles (H100, session 32)
def test_triton_prefill_matches_the_reference_at_128k(nsa_device, nsa_tolerance):
    """The prefill issue's shape (64 query heads, 4 KV heads, head dim 128, the paper's blocks) at
    128k + 77 tokens, a multiple of no block, in bfloat16: the kernels' blocks are a valid top-n of
    the float32 reference's scores on the first and the last 2048 rows, and their output and every
    gradient match the float32 reference given those blocks."""
    config, T, HQ, H, D = NSAConfig(), 131072 + 77, 64, 4, 128
    bf16 = dict(device=nsa_device, dtype=torch.bfloat16)
    q = torch.randn(1, T, HQ, D, **bf16)
    k, v = (torch.randn(1, T, H, D, **bf16) for _ in range(2))
    gates = torch.rand(1, T, HQ, 3, **bf16)
    do = torch.randn(1, T, HQ, D, **bf16)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, gates)]
    o, blocks = nsa_attention(*leaves, config, backend="triton", return_block_idx=True)
    o.backward(do)
    got = {"o": o.detach(), **{f"d{n}": x.grad for n, x in zip(("q", "k", "v", "gates"), leaves)}}
    del o, leaves

    k_cmp = mean_compress(k.float(), config, backend="reference")
    for first in (0, T - 2048):
        rows = q[:, first:first + 2048].float()
        ref_idx = select_blocks(rows, k_cmp, config, q_offset=first, backend="reference")
        assert_valid_selection(blocks[:, first:first + 2048], ref_idx, block_scores(rows, k_cmp, config, q_offset=first),
                               config, q_offset=first, eps=SELECTION_EPS[torch.bfloat16])
    del k_cmp

    up = [x.float().requires_grad_() for x in (q, k, v, gates)]
    ref_o = nsa_attention_with_blocks(*up, config, blocks)
    ref_o.backward(do.float())
    want = {"o": ref_o.detach(), **{f"d{n}": x.grad for n, x in zip(("q", "k", "v", "gates"), up)}}
    for name, value in got.items():
        assert_close(name, value, want[name], nsa_tolerance(torch.bfloat16, "fwd" if name == "o" else "grad"))
