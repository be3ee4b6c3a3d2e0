"""Triton gated sum of the branches against the float64 reference: ``o`` and every gradient.

CPU cases run through Triton's interpreter: a head dim that is not a power of two
(masked columns), a row count that is not a multiple of the row tile, gates in
another dtype than the outputs, and non-contiguous inputs. The ``gpu`` case runs a
real size in bfloat16.
"""

from __future__ import annotations

import pytest
import torch

from nsa.ops import combine_branches
from nsa.testing import assert_close

pytestmark = [pytest.mark.triton, pytest.mark.parity]


def _inputs(B, T, HQ, DV, dtype, gate_dtype, device):
    gates = torch.rand(B, T, HQ, 3, device=device, dtype=gate_dtype)
    outs = [torch.randn(B, T, HQ, DV, device=device, dtype=dtype) for _ in range(3)]
    return [gates, *outs]


def _run(inputs, backend, do):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    o = combine_branches(*inputs, backend=backend)
    (o.double() * do).sum().backward()
    return [o] + [x.grad for x in inputs]


def check(inputs, tol):
    do = torch.randn(inputs[1].shape, device=inputs[1].device, dtype=torch.float64)
    got = _run(inputs, "triton", do)
    want = _run([x.double() for x in inputs], "reference", do)
    assert got[0].dtype == inputs[1].dtype and got[1].dtype == inputs[0].dtype
    for name, a, b in zip(("o", "dgates", "do_cmp", "do_slc", "do_win"), got, want):
        assert a.shape == b.shape
        # the incoming gradient is rounded to the outputs' dtype, and dgates to the gates':
        # the coarser of the two bounds dgates
        coarse = max(a.dtype, inputs[1].dtype, key=lambda d: torch.finfo(d).eps)
        assert_close(name, a, b, tol(coarse, "fwd" if name == "o" else "grad"))


@pytest.mark.parametrize(
    "B, T, HQ, DV, dtype, gate_dtype",
    [
        (1, 37, 3, 24, torch.float32, torch.float32),
        (2, 19, 4, 16, torch.float16, torch.float32),
        (1, 5, 64, 128, torch.float32, torch.float16),
    ],
    ids=["odd-DV24", "fp16-fp32gates", "HQ64-D128"],
)
def test_gates_match_reference(B, T, HQ, DV, dtype, gate_dtype, nsa_device, nsa_tolerance):
    check(_inputs(B, T, HQ, DV, dtype, gate_dtype, nsa_device), nsa_tolerance)


def test_gates_non_contiguous(nsa_device, nsa_tolerance):
    gates, a, b, c = _inputs(1, 12, 4, 32, torch.float32, torch.float32, nsa_device)
    check([gates.transpose(1, 2).contiguous().transpose(1, 2), a.transpose(1, 2).contiguous().transpose(1, 2), b, c],
          nsa_tolerance)


def test_gates_reject_mismatched_branches(nsa_device):
    gates, a, b, c = _inputs(1, 4, 2, 8, torch.float32, torch.float32, nsa_device)
    with pytest.raises(ValueError, match="o_win must match o_cmp"):
        combine_branches(gates, a, b, c[..., :4], backend="triton")


@pytest.mark.gpu
def test_gates_gpu_bf16(nsa_device, nsa_tolerance):
    check(_inputs(1, 4099, 64, 128, torch.bfloat16, torch.bfloat16, nsa_device), nsa_tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gates_backward_writes_each_branch_delta(dtype, nsa_device):
    """With ``with_delta`` the backward also writes each branch's ``rowsum(o_branch * do)`` in
    float32, the softmax delta of that branch's backward when it applies the gate itself
    (the gates' gradient before rounding; odd sizes mask rows and columns), and the branch
    gradients only on request."""
    from nsa.ops._triton.attention import attn_bwd_delta
    from nsa.ops.gates.kernel import gates_bwd

    gates, *outs = _inputs(2, 23, 3, 24, dtype, torch.float32, nsa_device)
    do = torch.randn_like(outs[0])
    dgates, *d_outs, delta = gates_bwd(gates, *outs, do, with_delta=True)
    without = gates_bwd(gates, *outs, do)
    unstored = gates_bwd(gates, *outs, do, with_delta=True, store_do=False)
    assert without[4] is None and torch.equal(dgates, without[0])
    assert unstored[1:4] == (None, None, None) and torch.equal(unstored[0], dgates) and torch.equal(unstored[4], delta)
    assert delta.shape == (3, 2, 23, 3) and delta.dtype == torch.float32
    for i, (o, d_o, d_o_plain) in enumerate(zip(outs, d_outs, without[1:4])):
        assert torch.equal(d_o, d_o_plain)
        assert_close(f"delta[{i}]", delta[i], attn_bwd_delta(o, do), 1e-6)
        assert torch.equal(delta[i], dgates[..., i])  # float32 gates: the same sums
