"""``torch.compile`` over code that calls NSA: the public ops run as themselves, eagerly, between
the compiled graphs (``nsa.ops._dispatch.public_op``), and the results are eager's."""

from __future__ import annotations

import pytest
import torch

from nsa import NSAAttention, NSAConfig
from nsa.ops import nsa_attention
from nsa.testing import assert_close

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4, window=32)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch and leaves no compiled code behind."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _layer(device="cpu", dtype=torch.float64, heads=(4, 2), head_dim=16):
    torch.manual_seed(0)
    layer = NSAAttention(hidden_size=64, num_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim, config=SMALL)
    return layer.to(device=device, dtype=dtype)


def _train(model, x):
    y = model(x)
    return [y, *torch.autograd.grad(y.float().square().mean(), [x, *model.parameters()])]


def test_compiled_code_around_an_op_traces_nothing_inside_it():
    """Dynamo compiles the code before and after ``nsa_attention`` and runs the op itself: no
    node of any graph it builds comes from ``nsa/ops``, and the result is eager's, bitwise."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, v, gates):
        return nsa_attention(q * 2, k, v, gates, SMALL).sin()

    q = torch.randn(1, 70, 4, 16, dtype=torch.float64)
    k, v = torch.randn(1, 70, 2, 16, dtype=torch.float64), torch.randn(1, 70, 2, 16, dtype=torch.float64)
    gates = torch.rand(1, 70, 4, 3, dtype=torch.float64)
    assert torch.equal(torch.compile(f, backend=record)(q, k, v, gates), f(q, k, v, gates))
    traced = [n.meta.get("stack_trace") or "" for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert any("test_compile.py" in t for t in traced)  # q * 2 and sin were compiled ...
    assert not [t for t in traced if "nsa/ops" in t.replace("\\", "/")]  # ... and nothing of the op


def test_compiled_layer_trains_and_decodes_as_eager():
    """``torch.compile(layer)``: forward, the gradients of the input and of every parameter, and
    decode steps through a cache, equal to the eager layer's (float64, reference route)."""
    layer = _layer()
    compiled = torch.compile(layer, backend="aot_eager")
    x = torch.randn(1, 90, 64, dtype=torch.float64, requires_grad=True)
    for got, want in zip(_train(compiled, x), _train(layer, x)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-15)
    with torch.no_grad():
        steps = {}
        for name, model in (("eager", layer), ("compiled", compiled)):
            cache = layer.new_cache(batch_size=1)
            steps[name] = [model(x[:, :80], cache)] + [model(x[:, t : t + 1], cache) for t in range(80, 83)]
    for got, want in zip(steps["compiled"], steps["eager"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-15)


@pytest.mark.gpu
@pytest.mark.parity
def test_compiled_layer_on_the_gpu_matches_eager(nsa_device, nsa_tolerance):
    """``torch.compile(layer)`` with Inductor on the GPU (bf16, the Triton route): training and a
    no-grad forward equal the eager layer's within the bf16 bounds. Before the ops were run
    untraced, Inductor recompiled their Triton kernels and failed on the first one."""
    layer = _layer(nsa_device, torch.bfloat16, heads=(16, 2), head_dim=64)
    compiled = torch.compile(layer)
    x = torch.randn(1, 512, 64, device=nsa_device, dtype=torch.bfloat16, requires_grad=True)
    names = ["o", "dx"] + [f"d{name}" for name, _ in layer.named_parameters()]
    outs, wants = _train(compiled, x), _train(layer, x)
    largest = max(float(w.float().norm()) for w in wants[1:])
    for name, got, want in zip(names, outs, wants):
        # the key compression's last bias shifts every compressed key alike, which no softmax
        # sees: its gradient is zero but for rounding, and a relative error of it means nothing
        if name == "o" or float(want.float().norm()) > 1e-4 * largest:
            assert_close(name, got, want, nsa_tolerance(torch.bfloat16, "fwd" if name == "o" else "grad"))
    with torch.no_grad():
        assert_close("o", compiled(x), layer(x), nsa_tolerance(torch.bfloat16))
