"""``torch.compile`` over code that calls NSA: the public ops run as themselves, eagerly, between
the compiled graphs (``nsa.ops._dispatch.public_op``), and the results are eager's."""

from __future__ import annotations

import pytest
import torch

from nsa import NSAAttention, NSAConfig
from nsa.ops import nsa_attention

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
def test_compiled_code_around_the_triton_op_on_the_gpu_equals_eager(nsa_device):
    """With Inductor on the GPU (bf16, the Triton route), code around ``nsa_attention`` compiles
    and the op gives eager's output and gradients, bitwise: it runs untraced, on the same
    inputs. Before, Dynamo captured its Triton kernels, and Inductor failed to recompile the
    first one (the compressed forward: its float scale typed float64)."""
    torch.manual_seed(0)
    like = dict(device=nsa_device, dtype=torch.bfloat16)
    q = torch.randn(1, 300, 16, 64, **like, requires_grad=True)
    k, v = (torch.randn(1, 300, 2, 64, **like, requires_grad=True) for _ in range(2))
    gates = torch.rand(1, 300, 16, 3, **like, requires_grad=True)
    grad_out = torch.randn(1, 300, 16, 64, **like)

    def f(q, k, v, gates):
        # scaling by 2 and by 0.5 is exact: compiled or not, the op sees the same tensors
        return nsa_attention(q, k, v, gates * 0.5, SMALL) * 2

    inputs = [q, k, v, gates]
    eager = f(*inputs)
    want = [eager, *torch.autograd.grad(eager, inputs, grad_out)]
    out = torch.compile(f)(*inputs)
    got = [out, *torch.autograd.grad(out, inputs, grad_out)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
