"""The rotary embedding's Triton kernel against its float64 reference: output and the gradient of
``x``, for tables shared by the batch (``[T, 1, D/2]``) and per sequence (``[B, T, 1, D/2]``),
halves that are not a power of two, head counts that do not fill a program, and inputs whose rows
are strided. On CPU through Triton's interpreter; the ``gpu`` case at a layer's real size."""

from __future__ import annotations

import pytest
import torch

from nsa.ops import apply_rotary
from nsa.testing import assert_close

pytestmark = [pytest.mark.triton, pytest.mark.parity]


def _tables(B, T, D, per_sequence, dtype, device):
    """``(cos, sin)`` of random positions and frequencies (fresh angles, not a layer's)."""
    positions = torch.randint(0, 70000, (B, T) if per_sequence else (T,), device=device, dtype=torch.float64)
    angles = positions[..., None] * torch.rand(D // 2, device=device, dtype=torch.float64)
    return angles.cos().to(dtype).unsqueeze(-2), angles.sin().to(dtype).unsqueeze(-2)


def _check(B, T, heads, D, per_sequence, dtype, device, tol, strided=False):
    x = torch.randn(B, T, heads + 2 * strided, D, device=device, dtype=dtype)
    x = x[:, :, 1 : 1 + heads] if strided else x  # rows two heads apart
    cos, sin = _tables(B, T, D, per_sequence, dtype, device)
    dy = torch.randn(B, T, heads, D, device=device, dtype=torch.float64)
    leaf = x.detach().requires_grad_()
    y = apply_rotary(leaf, cos, sin, backend="triton")
    assert y.dtype == dtype and y.shape == x.shape
    (dx,) = torch.autograd.grad(y, leaf, dy.to(dtype))
    ref_leaf = x.detach().double().requires_grad_()
    ref = apply_rotary(ref_leaf, cos.double(), sin.double(), backend="reference")
    (ref_dx,) = torch.autograd.grad(ref, ref_leaf, dy)
    assert_close("y", y, ref, tol(dtype, "fwd"))
    assert_close("dx", dx, ref_dx, tol(dtype, "grad"))


@pytest.mark.parametrize(
    "B, T, heads, D, per_sequence, strided",
    [
        pytest.param(2, 37, 3, 12, False, False, id="shared-table-half6-heads3"),
        pytest.param(2, 19, 5, 16, True, False, id="per-sequence-table"),
        pytest.param(1, 23, 4, 32, False, True, id="strided-rows"),
        # 40 heads of 256: two programs a position (32 heads each, the second part-filled)
        pytest.param(1, 5, 40, 256, False, False, id="heads-over-two-programs"),
    ],
)
def test_rotary_triton_matches_reference(B, T, heads, D, per_sequence, strided, nsa_device, nsa_tolerance):
    _check(B, T, heads, D, per_sequence, torch.float32, nsa_device, nsa_tolerance, strided)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_rotary_triton_real_size(heads, dtype, nsa_device, nsa_tolerance):
    """A layer's queries (64 heads) and keys (4), 4096 positions, head dim 128."""
    _check(1, 4096, heads, 128, False, dtype, nsa_device, nsa_tolerance)


def test_rotary_names_a_bad_argument():
    x = torch.randn(1, 5, 2, 8)
    cos = torch.randn(5, 1, 4)
    with pytest.raises(ValueError, match=r"even last dimension"):
        apply_rotary(torch.randn(1, 5, 2, 7), cos, cos)
    with pytest.raises(ValueError, match=r"sin must have shape \[\(B,\) T, 1, D/2\] = \[5, 1, 4\], got \[5, 2, 4\]"):
        apply_rotary(x, cos, cos.expand(5, 2, 4))
    with pytest.raises(TypeError, match=r"cos has dtype torch.float64 but x has torch.float32"):
        apply_rotary(x, cos.double(), cos)
