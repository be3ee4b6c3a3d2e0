"""The rotary embedding's Triton kernel against its float64 reference: output and the gradient of
``x``, for tables shared by the batch (``[T, 1, D/2]``) and per sequence (``[B, T, 1, D/2]``),
halves that are not a power of two, head counts that do not fill a program, and inputs whose rows
are strided; the tables' kernel against theirs, bit for bit. On CPU through Triton's interpreter;
the ``gpu`` cases at a layer's real size."""

from __future__ import annotations

import pytest
import torch

from nsa.modules.rotary import RotaryEmbedding
from nsa.ops import apply_rotary, rope_tables
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(
    "shape, D", [((37,), 12), ((3, 20), 128), ((1, 1), 6)], ids=["shared-half6", "per-sequence-half64", "one-half3"]
)
def test_rope_tables_triton_equal_reference(shape, D, dtype, nsa_device):
    """The tables' one launch gives the reference's tables bit for bit on the GPU: cosines and
    sines of float64 angles, rounded to the dtype through float32 as PyTorch rounds them;
    positions up to about a million (angles of many turns), a layer's frequencies. Triton's
    interpreter rounds float32 to 16 bits its own way (not always to nearest), so on CPU 16-bit
    tables may differ by one unit in the last place, no more."""
    positions = torch.randint(0, 1_000_003, shape, device=nsa_device)
    inv_freq = RotaryEmbedding(D).inv_freq(nsa_device)
    got = rope_tables(positions, inv_freq, dtype, backend="triton")
    want = rope_tables(positions, inv_freq, dtype, backend="reference")
    for name, g, w in zip(("cos", "sin"), got, want):
        assert g.shape == (*shape, 1, D // 2) and g.dtype == dtype, name
        if nsa_device.type == "cuda" or dtype == torch.float32:
            assert torch.equal(g, w), f"{name}: {(g != w).sum()} of {g.numel()} differ"
        else:
            ulp = torch.finfo(dtype).eps * w.float().abs().clamp_min(torch.finfo(dtype).tiny)  # at most 2x the spacing
            assert ((g.float() - w.float()).abs() <= ulp).all(), name


def test_rope_tables_name_a_bad_argument():
    inv_freq = RotaryEmbedding(8).inv_freq(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"positions must be a \[T\] or \[B, T\] tensor"):
        rope_tables(torch.zeros(1, 2, 3, dtype=torch.int64), inv_freq, torch.float32)
    with pytest.raises(TypeError, match="positions must be int32/int64, got torch.float32"):
        rope_tables(torch.zeros(4), inv_freq, torch.float32)
    with pytest.raises(TypeError, match="inv_freq must be float64, got torch.float32"):
        rope_tables(torch.zeros(4, dtype=torch.int64), inv_freq.float(), torch.float32)
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype, got torch.int32"):
        rope_tables(torch.zeros(4, dtype=torch.int64), inv_freq, torch.int32)
