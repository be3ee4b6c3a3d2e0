"""The whole NSA prefill on Triton (fused compressed attention + selection, selected,
window, mean compression) against the float64 reference: output, blocks and every gradient.

On CPU this runs through Triton's interpreter at small sizes; the ``gpu`` case runs a
real size in bfloat16 against a float32 reference.
"""

from __future__ import annotations

import pytest
import torch

from nsa import NSAConfig, nsa_attention
from nsa.testing import assert_close

pytestmark = [pytest.mark.triton, pytest.mark.parity]

SMALL = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=24)


def _run(q, k, v, gates, config, backend, do):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, gates)]
    o, block_idx = nsa_attention(*leaves[:4], config, backend=backend, return_block_idx=True)
    (o.double() * do).sum().backward()
    return o, block_idx, [x.grad for x in leaves]


def _check(B, T, HQ, H, DK, DV, config, dtype, ref_dtype, device, tol):
    q = torch.randn(B, T, HQ, DK, device=device, dtype=dtype)
    k = torch.randn(B, T, H, DK, device=device, dtype=dtype)
    v = torch.randn(B, T, H, DV, device=device, dtype=dtype)
    gates = torch.rand(B, T, HQ, 3, device=device, dtype=dtype)
    do = torch.randn(B, T, HQ, DV, device=device, dtype=torch.float64)
    o, blocks, grads = _run(q, k, v, gates, config, "triton", do)
    ref_o, ref_blocks, ref_grads = _run(*(x.to(ref_dtype) for x in (q, k, v, gates)), config, "reference", do)
    assert o.dtype == dtype
    # Random inputs leave no exact ties, so the blocks agree everywhere.
    agree = (blocks == ref_blocks).all(-1).double().mean().item()
    assert agree >= 0.99, f"selected blocks agree on only {agree:.2%} of rows"
    assert_close("o", o, ref_o, tol(dtype, "fwd"))
    for name, got, want in zip(("dq", "dk", "dv", "dgates"), grads, ref_grads):
        assert_close(name, got, want, tol(dtype, "grad"))


@pytest.mark.parametrize(
    "B, T, HQ, H, DK, DV",
    [
        pytest.param(1, 91, 4, 1, 16, 16, id="B1-T91-HQ4-H1-D16"),
        pytest.param(2, 70, 4, 2, 32, 16, id="B2-T70-HQ4-H2-DK32-DV16"),
    ],
)
def test_nsa_attention_triton_matches_reference(B, T, HQ, H, DK, DV, nsa_device, nsa_tolerance):
    _check(B, T, HQ, H, DK, DV, SMALL, torch.float32, torch.float64, nsa_device, nsa_tolerance)


@pytest.mark.gpu
def test_nsa_attention_triton_bf16_real_size(nsa_device, nsa_tolerance):
    _check(1, 4096 + 77, 64, 4, 128, 128, NSAConfig(), torch.bfloat16, torch.float32, nsa_device, nsa_tolerance)
