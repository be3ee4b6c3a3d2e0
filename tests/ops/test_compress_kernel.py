"""Triton mean compression against the float64 reference: values and the gradient."""

from __future__ import annotations

import pytest
import torch

from nsa import NSAConfig
from nsa.ops import mean_compress
from nsa.testing import assert_close

pytestmark = [pytest.mark.triton, pytest.mark.parity]


def _forward_backward(x, config, backend, dy):
    x = x.detach().clone().requires_grad_()
    y = mean_compress(x, config, backend=backend)
    (y.double() * dy).sum().backward()
    return y, x.grad


@pytest.mark.parametrize(
    "shape, config",
    [
        pytest.param((1, 77, 3, 40), NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4), id="B1-T77-H3-D40"),
        pytest.param((2, 100, 2, 16), NSAConfig(), id="B2-T100-H2-D16-defaults"),
        pytest.param((1, 131, 1, 192), NSAConfig(cmp_block=12, cmp_stride=4, sel_block=12, sel_count=4),
                     id="B1-T131-H1-D192-l12"),
        pytest.param((1, 50, 2, 24), NSAConfig(cmp_block=8, cmp_stride=8, sel_block=8, sel_count=4), id="B1-T50-D24-l=d"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mean_compress_matches_reference(shape, config, dtype, nsa_device, nsa_tolerance):
    x = torch.randn(*shape, device=nsa_device, dtype=dtype)
    nc = config.num_cmp(shape[1])
    dy = torch.randn(shape[0], nc, *shape[2:], device=nsa_device, dtype=torch.float64)
    y, dx = _forward_backward(x, config, "triton", dy)
    y_ref, dx_ref = _forward_backward(x.double(), config, "reference", dy)
    assert y.dtype == dtype and y.shape == y_ref.shape and dx.dtype == dtype
    assert_close("y", y, y_ref, nsa_tolerance(dtype, "fwd"))
    assert_close("dx", dx, dx_ref, nsa_tolerance(dtype, "grad"))


def test_mean_compress_tail_and_empty(nsa_device):
    """Positions past the last complete block get zero gradient; T < cmp_block gives no token."""
    config = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4)
    x = torch.randn(1, 30, 2, 16, device=nsa_device)  # tokens cover positions 0..27
    y, dx = _forward_backward(x, config, "triton", torch.ones(1, 6, 2, 16, device=nsa_device, dtype=torch.float64))
    assert (dx[:, 28:] == 0).all() and (dx[:, 4:24] == 0.25).all()
    empty = mean_compress(torch.randn(1, 7, 2, 16, device=nsa_device), config, backend="triton")
    assert empty.shape == (1, 0, 2, 16)


def test_mean_compress_non_contiguous(nsa_device):
    config = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4)
    x = torch.randn(1, 3, 41, 16, device=nsa_device).transpose(1, 2)  # [1, 41, 3, 16], stride(1) != H*D
    y = mean_compress(x, config, backend="triton")
    assert_close("y", y, mean_compress(x.double(), config, backend="reference"), 1e-6)


@pytest.mark.gpu
def test_mean_compress_gpu_bf16(nsa_device, nsa_tolerance):
    config = NSAConfig()
    x = torch.randn(2, 65537, 4, 192, device=nsa_device, dtype=torch.bfloat16)
    dy = torch.randn(2, config.num_cmp(65537), 4, 192, device=nsa_device, dtype=torch.float64)
    y, dx = _forward_backward(x, config, "triton", dy)
    y_ref, dx_ref = _forward_backward(x.double(), config, "reference", dy)
    assert_close("y", y, y_ref, nsa_tolerance(torch.bfloat16, "fwd"))
    assert_close("dx", dx, dx_ref, nsa_tolerance(torch.bfloat16, "grad"))
