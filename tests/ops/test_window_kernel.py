"""Triton sliding-window attention against the float64 reference: ``o`` and every gradient.

On CPU the kernels run through Triton's interpreter at small, odd sizes that
still reach every code path: masked band edges and unmasked middle tiles, G in
{1, 4, 16} and a non-power-of-two G, Dk != Dv (192/128 included), windows
shorter and longer than T, a query offset with a longer key buffer (decode-style
cache) and non-contiguous inputs. The ``gpu`` cases run real sizes in bfloat16
(CPU cases use float16: Triton 3.9's interpreter computes bfloat16 ``tl.dot`` wrongly).
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from nsa import NSAConfig, routing
from nsa.ops import sliding_window_attention
from nsa.ops._triton.attention import EXACT_FLOAT32_TILES
from nsa.testing import assert_close

from _kernel_inputs import assert_bitwise_repeatable, gpu_shapes, qkv

pytestmark = [pytest.mark.triton, pytest.mark.parity]


def _forward_backward(q, k, v, config, q_offset, backend, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = sliding_window_attention(q, k, v, config, q_offset=q_offset, backend=backend)
    (o.double() * do).sum().backward()
    return o, q.grad, k.grad, v.grad


def check_against_reference(q, k, v, config, q_offset, tol, ref_dtype=torch.float64):
    """Kernel in q's dtype vs the reference in ``ref_dtype``: forward, dq, dk, dv."""
    do = torch.randn(*q.shape[:3], v.shape[-1], device=q.device, dtype=torch.float64)
    out = _forward_backward(q, k, v, config, q_offset, "triton", do)
    ref = _forward_backward(q.to(ref_dtype), k.to(ref_dtype), v.to(ref_dtype), config, q_offset, "reference", do)
    assert out[0].dtype == q.dtype
    for name, got, want in zip(("o", "dq", "dk", "dv"), out, ref):
        assert got.shape == want.shape
        assert_close(name, got, want, tol(q.dtype, "fwd" if name == "o" else "grad"))


CASES = [
    # (B, T, HQ, H, DK, DV, window, q_offset, TK)
    pytest.param(1, 77, 4, 1, 32, 32, 16, 0, 77, id="B1-T77-HQ4-H1-D32-W16"),
    pytest.param(2, 53, 2, 2, 16, 32, 64, 0, 53, id="B2-T53-HQ2-H2-DK16-DV32-W64"),
    pytest.param(1, 45, 16, 1, 16, 16, 9, 0, 45, id="B1-T45-HQ16-H1-D16-W9"),
    pytest.param(1, 37, 6, 2, 48, 24, 21, 11, 61, id="B1-T37-HQ6-H2-DK48-DV24-W21-off11-TK61"),
]


@pytest.mark.parametrize("B, T, HQ, H, DK, DV, window, q_offset, TK", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_window_matches_reference(B, T, HQ, H, DK, DV, window, q_offset, TK, dtype, nsa_device, nsa_tolerance):
    config = NSAConfig(window=window)
    q, k, v = qkv(B, T, HQ, H, DK, DV, dtype, nsa_device, TK)
    check_against_reference(q, k, v, config, q_offset, nsa_tolerance)


@pytest.mark.parametrize("window, q_offset, TK", [(40, 0, 90), (33, 7, 97)], ids=["W40", "W33-off7-TK97"])
def test_window_dkdv_phased_walk(window, q_offset, TK, nsa_device):
    """The dK/dV kernel's band walked from the run of positions whose index is a multiple of the
    band's run count, wrapping (``PHASED``, BN 16: 3-4 runs a band, every start phase), gives the
    gradients of the walk from the band's start (float32 rounding) and the reference's."""
    from nsa.ops.window.kernel import window_bwd, window_fwd

    T, HQ, H, D = TK - q_offset, 4, 2, 16
    q, k, v = qkv(1, T, HQ, H, D, D, torch.float32, nsa_device, TK)
    do = torch.randn(1, T, HQ, D, device=nsa_device)
    scale = D**-0.5
    o, lse = window_fwd(q, k, v, window, scale, q_offset)
    got, want = (window_bwd(q, k, v, o, lse, do, window, scale, q_offset,
                            tiles={"dkdv": dict(rows=16, BN=16, num_warps=4, num_stages=1, PHASED=phased)})
                 for phased in (True, False))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_close(name, g, w, 1e-5)
    ref = _forward_backward(q.double(), k.double(), v.double(), NSAConfig(window=window), q_offset, "reference",
                            do.double())[1:]
    for name, g, w in zip(("dk", "dv"), got[1:], ref[1:]):
        assert_close(name, g, w, 1e-4)


def test_window_dk192_dv128(nsa_device, nsa_tolerance):
    q, k, v = qkv(1, 29, 4, 1, 192, 128, torch.float16, nsa_device)
    check_against_reference(q, k, v, NSAConfig(window=12), 0, nsa_tolerance)


def test_window_non_contiguous_inputs(nsa_device, nsa_tolerance):
    """q/k/v sliced out of a fused projection (stride(-1) == 1, other strides odd) and
    a transposed one (stride(-1) != 1, copied by the wrapper)."""
    B, T, HQ, H, D = 1, 33, 4, 2, 16
    qkv = torch.randn(B, T, HQ + 2 * H, D, device=nsa_device)
    q, k = qkv[:, :, :HQ], qkv[:, :, HQ : HQ + H]
    v = torch.randn(B, T, D, H, device=nsa_device).transpose(2, 3)
    assert not q.is_contiguous() and v.stride(-1) != 1
    check_against_reference(q, k, v, NSAConfig(window=10), 0, nsa_tolerance)


def test_window_no_grad_saves_nothing(nsa_device):
    q, k, v = qkv(1, 19, 2, 1, 16, 16, torch.float32, nsa_device)
    o = sliding_window_attention(q, k, v, NSAConfig(window=5), backend="triton")
    assert o.grad_fn is None and torch.isfinite(o).all()


@pytest.mark.gpu
@gpu_shapes()
def test_window_gpu_bf16(T, HQ, H, DK, DV, nsa_device, nsa_tolerance):
    """Real sizes, bfloat16 kernel vs float32 reference (paper window 512)."""
    q, k, v = qkv(1, T, HQ, H, DK, DV, torch.bfloat16, nsa_device)
    check_against_reference(q, k, v, NSAConfig(), 0, nsa_tolerance, ref_dtype=torch.float32)


@pytest.mark.gpu
def test_window_gpu_backward_deterministic(nsa_device):
    q, k, v = qkv(1, 2048, 32, 2, 128, 128, torch.bfloat16, nsa_device)
    do = torch.randn(1, 2048, 32, 128, device=nsa_device, dtype=torch.float64)
    assert_bitwise_repeatable(lambda: _forward_backward(q, k, v, NSAConfig(), 0, "triton", do))


def test_window_dkdv_tiles_by_head_width_and_dtype(monkeypatch):
    """dK/dV takes 128-key tiles in 3 stages, its band walked phased, for 16-bit heads up to 128
    wide (half the q/do re-reads of 64-key tiles), and 64-key tiles in 2 stages for wider heads,
    whose accumulators would not fit, and for float32 on tensor cores, whose 128-key tiles need more
    shared memory than an H100 has (in 1 stage); exact float32 takes its own tiles; a caller's
    override wins."""
    from nsa.ops.window import kernel

    monkeypatch.setenv("NSA_FLOAT32_DOT", "ieee")

    def cfg(kind, dk, dv, tiles=None, dtype=torch.bfloat16):
        return kernel._bwd_cfg(kind, 16, dk, dv, tiles, dtype, torch.device("cpu"))

    assert cfg("dkdv", 128, 128)["BN"] == 128
    assert cfg("dkdv", 128, 128)["PHASED"]  # measured on these tiles only (session 54)
    assert cfg("dkdv", 192, 128)["BN"] == 64
    assert cfg("dkdv", 128, 256)["BN"] == 64
    small = cfg("dkdv", 128, 128, dtype=torch.float32)
    exact = EXACT_FLOAT32_TILES
    assert (small["BN"], small["BT"] * small["GP"], small["num_warps"], small["num_stages"]) == (
        exact["BN"], exact["rows"], exact["num_warps"], exact["num_stages"])
    monkeypatch.setenv("NSA_FLOAT32_DOT", "tf32x3")
    small = cfg("dkdv", 128, 128, dtype=torch.float32)
    assert (small["BN"], small["num_stages"]) == (64, 1)
    assert cfg("dkdv", 128, 128, dtype=torch.float16)["BN"] == 128
    assert cfg("dkdv", 128, 128, {"dkdv": {"BN": 32}})["BN"] == 32
    assert cfg("dq", 128, 128)["BN"] == 64


@pytest.mark.gpu
@pytest.mark.requires(feature="triton_float32")
@pytest.mark.parametrize("DK, DV", [(128, 128), (192, 128)], ids=["D128", "DK192-DV128"])
def test_window_float32_wide_heads_on_gpu(DK, DV, nsa_device, nsa_tolerance):
    """float32 inputs at head dims 128 and 192/128 launch within the GPU's shared memory (the
    128-key dK/dV tiles needed 289 KiB, past an H100's 227) and match the reference, forward and
    gradients. Exact float32 compiles on tiles of its own since session 30 (its window backward
    took 140 s to compile at the 16-bit tiles). Below Hopper's shared memory, float32 heads wider
    than 128 take the reference (``nsa.routing``): skipped there with the router's reason."""
    ok, why = routing.triton_status("window", nsa_device, torch.float32, max(DK, DV))
    if not ok:
        pytest.skip(why)
    q, k, v = qkv(1, 150, 4, 1, DK, DV, torch.float32, nsa_device)
    check_against_reference(q, k, v, NSAConfig(window=40), 0, nsa_tolerance)
