"""A decode step's gates in one launch (:mod:`nsa.ops.decode.gate_projection`) against the product
and sigmoid of the modules: float32 through the interpreter on the CPU, bf16 on a GPU at the
benchmark layer's size, with and without programmatic dependent launch; where the layer takes it
and where it keeps the modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nsa import NSAAttention, NSAConfig
from nsa.ops.decode.gate_projection import project_gates

pytestmark = [pytest.mark.triton]


def _modules(x: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
    return torch.sigmoid(proj(x))


@pytest.mark.parametrize(
    "lead, K, N",
    [
        pytest.param((1, 1), 24, 12, id="one-row"),
        pytest.param((3, 6), 200, 40, id="rows-over-two-tiles-K-not-a-tile"),
        pytest.param((2, 1), 64, 192, id="64-heads"),
    ],
)
def test_gates_in_one_launch_equal_the_product_and_sigmoid(lead, K, N, nsa_device) -> None:
    """``sigmoid(x @ weight.T + bias)`` for rows past one tile (18 > 16), widths that fill no tile
    and 192 gates (64 heads): within 1e-6 of the modules in float32 (the interpreter), within one
    rounding of bf16 logits on a GPU (the products' order of summation differs)."""
    dtype = torch.bfloat16 if nsa_device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    proj = nn.Linear(K, N).to(nsa_device, dtype)
    x = torch.randn(*lead, K, device=nsa_device, dtype=dtype)
    with torch.no_grad():
        got, want = project_gates(x, proj.weight, proj.bias), _modules(x, proj)
    assert got.dtype == dtype and got.shape == (*lead, N)
    tol = 4e-3 if dtype == torch.bfloat16 else 1e-6  # a bf16 logit's unit in the last place times sigmoid' <= 1/4
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


def test_project_gates_names_a_bad_argument() -> None:
    x, weight, bias = torch.randn(1, 8), torch.randn(4, 8), torch.randn(4)
    with pytest.raises(ValueError, match=r"weight must be \[N, 8\] and bias \[N\], got \[4, 6\] and \[4\]"):
        project_gates(x, weight[:, :6], bias)
    with pytest.raises(ValueError, match="bias must be a contiguous torch.float32 tensor on cpu, got torch.float64"):
        project_gates(x, weight, bias.double())
    with pytest.raises(ValueError, match="weight must be a contiguous"):
        project_gates(x, torch.randn(8, 4).t(), bias)


def _layer_and_cache(device: torch.device, dtype: torch.dtype, backend: str):
    torch.manual_seed(1)
    config = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=3, window=8)
    layer = NSAAttention(32, 4, 2, 8, config=config, backend=backend).to(device, dtype)
    return layer, layer.new_cache(2, capacity=40, static=True)


def test_decode_steps_take_the_launch_where_the_modules_would_compute_the_same(monkeypatch) -> None:
    """On the Triton route, a device step's gates are one launch, and the step's output is the
    modules' (float32, within 1e-6). Prefills, the reference route, a gradient wanted and autocast
    keep the modules."""
    import nsa.ops.decode.gate_projection as gate_projection

    calls = []
    real = gate_projection.project_gates
    monkeypatch.setattr(gate_projection, "project_gates", lambda *a, **k: (calls.append(a[0].shape), real(*a, **k))[1])
    outputs = {}
    for route in ("triton", "reference"):
        layer, cache = _layer_and_cache(torch.device("cpu"), torch.float32, route)
        x = torch.randn(2, 20, 32)
        with torch.no_grad():
            layer(x, cache)  # a prefill (past DEVICE_STEP_MAX_TOKENS): the modules
            outputs[route] = layer(torch.randn(2, 1, 32), cache)
    assert calls == [torch.Size([2, 1, 32])]  # the triton route's step only
    torch.testing.assert_close(outputs["triton"], outputs["reference"], rtol=1e-5, atol=1e-5)
    layer, _ = _layer_and_cache(torch.device("cpu"), torch.float32, "triton")
    x = torch.randn(2, 1, 32)
    assert not layer._gates_in_one_launch(x)  # parameters that want a gradient
    with torch.no_grad():
        assert layer._gates_in_one_launch(x)
        assert not layer._gates_in_one_launch(x.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not layer._gates_in_one_launch(x)
        layer.gate_proj = nn.Linear(32, 12, bias=False)
        assert not layer._gates_in_one_launch(x)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_gates_launched_early_change_nothing_but_timing(batch, nsa_device) -> None:
    """The benchmark layer's gates (hidden 2048, 64 heads) right after a rotation, as a decode step
    runs them: with programmatic dependent launch bitwise those without, and close to the bf16
    modules' (within one rounding of a logit)."""
    from nsa.ops import apply_rotary
    from nsa.ops._triton.device import pdl_supported

    if not pdl_supported(nsa_device):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 or later")
    torch.manual_seed(2)
    proj = nn.Linear(2048, 192).to(nsa_device, torch.bfloat16)
    x = torch.randn(batch, 1, 2048, device=nsa_device, dtype=torch.bfloat16)
    heads = torch.randn(batch, 1, 76, 128, device=nsa_device, dtype=torch.bfloat16)
    angles = torch.rand(1, 1, 64, device=nsa_device, dtype=torch.float32)
    got = {}
    with torch.no_grad():
        for pdl in (False, True, True, False):
            apply_rotary(heads, angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16), backend="triton")
            got.setdefault(pdl, []).append(project_gates(x, proj.weight, proj.bias, pdl=pdl))
        want = _modules(x, proj)
    for gates in (*got[True], got[False][1]):
        assert torch.equal(gates, got[False][0])
    torch.testing.assert_close(got[False][0], want, rtol=0, atol=4e-3)
