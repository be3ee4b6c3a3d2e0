"""``torch.compile`` over code that calls NSA: the public ops run as themselves, eagerly, between
the compiled graphs (``nsa.ops._dispatch.public_op``), and the results are eager's."""

from __future__ import annotations

import pytest
import torch

from nsa import NSAAttention, NSAConfig, ops
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


def _op_calls():
    """``name: (call, inputs)`` of every public op on small float64 CPU tensors."""
    torch.manual_seed(0)
    x = lambda *shape: torch.randn(*shape, dtype=torch.float64)  # noqa: E731
    q, k, v, gates = x(1, 70, 4, 16), x(1, 70, 2, 16), x(1, 70, 2, 16), torch.rand(1, 70, 4, 3, dtype=torch.float64)
    k_cmp, v_cmp = ops.mean_compress(k, SMALL), ops.mean_compress(v, SMALL)
    block_idx = ops.select_blocks(q, k_cmp, SMALL)
    branch = x(1, 70, 4, 16)
    cache = dict(k=x(1, 80, 2, 16), v=x(1, 80, 2, 16), k_cmp=x(1, 19, 2, 16), v_cmp=x(1, 19, 2, 16))
    return {
        "nsa_attention": (lambda q, k, v, g: ops.nsa_attention(q, k, v, g, SMALL), (q, k, v, gates)),
        "mean_compress": (lambda k: ops.mean_compress(k, SMALL), (k,)),
        "compressed_attention": (lambda q, kc, vc: ops.compressed_attention(q, kc, vc, SMALL)[0], (q, k_cmp, v_cmp)),
        "select_blocks": (lambda q, kc: ops.select_blocks(q, kc, SMALL), (q, k_cmp)),
        "selected_attention": (lambda q, k, v, b: ops.selected_attention(q, k, v, b, SMALL), (q, k, v, block_idx)),
        "sliding_window_attention": (lambda q, k, v: ops.sliding_window_attention(q, k, v, SMALL), (q, k, v)),
        "combine_branches": (lambda g, a, b, c: ops.combine_branches(g, a, b, c), (gates, branch, branch, branch)),
        "nsa_decode": (
            lambda q, k, v, g, kc, vc: ops.nsa_decode(q, k, v, g, torch.tensor([80], dtype=torch.int32), SMALL,
                                                      kv_cmp=(kc, vc)),
            (q[:, :1], cache["k"], cache["v"], gates[:, :1], cache["k_cmp"], cache["v_cmp"])),
    }  # fmt: skip


def test_every_public_op_is_covered():
    assert sorted(_op_calls()) == sorted(ops.__all__)


@pytest.mark.parametrize("name", sorted(ops.__all__))
def test_compiled_code_around_an_op_traces_nothing_inside_it(name):
    """Dynamo compiles the code before and after each public op and runs the op itself: no
    node of any graph it builds comes from ``nsa/ops``, and the result is eager's, bitwise."""
    call, inputs = _op_calls()[name]
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(*args):
        doubled = [a * 2 if a.is_floating_point() else a for a in args]
        out = call(*doubled)
        return out.sin()

    assert torch.equal(torch.compile(f, backend=record)(*inputs), f(*inputs))
    traced = [n.meta.get("stack_trace") or "" for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert any("test_compile.py" in t for t in traced)  # the doubling and sin were compiled ...
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
