"""``torch.compile`` and ``torch.export`` over code that calls NSA.

The four public ops a model calls, ``nsa_attention``, ``mean_compress``, ``nsa_decode`` and
``apply_rotary``, become ``torch.library`` custom ops when traced (:mod:`nsa.ops.library`): a
graph holds each as one node, ``fullgraph=True`` and ``torch.export`` work, and training on the
Triton route runs the eager Triton backward. The other public ops run as themselves, eagerly,
between the compiled graphs (``nsa.ops._dispatch.public_op``). Either way the results are eager's.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from nsa import NSAAttention, NSAConfig, ops
from nsa.ops import nsa_attention
from nsa.testing import recorded_cuda_graphs

#: its window holds the local blocks: on Triton the window kernels compute the selected branch's
#: forced blocks too, where both branches read (k, v) and q_offset is a multiple of their tile's positions
SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4, window=32)
#: public op -> its custom op (nsa.ops.library); the others break the graph
CUSTOM_OPS = {"nsa_attention": "nsa.attention", "mean_compress": "nsa.mean_compress", "nsa_decode": "nsa.decode",
              "apply_rotary": "nsa.rotary"}
GRAPH_BREAKS = sorted(set(ops.__all__) - set(CUSTOM_OPS))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch and leaves no compiled code behind."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _layer(device="cpu", dtype=torch.float64, heads=(4, 2), head_dim=16, **kwargs):
    torch.manual_seed(0)
    layer = NSAAttention(hidden_size=64, num_heads=heads[0], num_kv_heads=heads[1], head_dim=head_dim, config=SMALL,
                         **kwargs)
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
    tables = [x(70, 1, 8) for _ in range(2)]
    return {
        "apply_rotary": (lambda q, cos, sin: ops.apply_rotary(q, cos, sin), (q, *tables)),
        "rope_tables": (lambda positions, inv_freq: ops.rope_tables(positions, inv_freq, torch.float64)[1],
                        (torch.arange(70), torch.rand(8, dtype=torch.float64))),
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


def _nsa_nodes(graphs):
    """The custom ops of nsa that the graphs call, by name (``nsa.attention``, ...), in order."""
    return [str(n.target).removesuffix(".default") for gm in graphs for n in gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("nsa.")]


def _recording_backend():
    """A Dynamo backend that runs what AOTAutograd makes of a graph as it is, and the graphs it
    made: ``{"forward": [...], "backward": [...]}``."""
    graphs = {"forward": [], "backward": []}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)

        return compiler

    return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward")), graphs


@pytest.mark.parametrize("name", sorted(CUSTOM_OPS))
def test_a_graph_holds_the_op_as_its_custom_op(name):
    """``fullgraph=True`` compiles the code around the op and the op as one node, its custom op;
    nothing of its Python is traced, and the result is eager's, bitwise."""
    call, inputs = _op_calls()[name]
    backend, graphs = _recording_backend()

    def f(*args):
        doubled = [a * 2 if a.is_floating_point() else a for a in args]
        return call(*doubled).sin()

    assert torch.equal(torch.compile(f, backend=backend, fullgraph=True)(*inputs), f(*inputs))
    # nsa_attention without kv_cmp mean-compresses its keys and values first
    assert _nsa_nodes(graphs["forward"]) == ["nsa.mean_compress"] * 2 * (name == "nsa_attention") + [CUSTOM_OPS[name]]
    traced = [n.meta.get("stack_trace") or "" for gm in graphs["forward"] for n in gm.graph.nodes]
    assert not [t for t in traced if "nsa/ops" in t.replace("\\", "/") and "library.py" not in t]


@pytest.mark.parametrize("name", GRAPH_BREAKS)
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


def _triton_inputs(T, kv_len, heads=(4, 2), dims=(16, 16), requires=(True,) * 4, dtype=torch.float32, device="cpu"):
    """``q, k, v, gates`` for the Triton route: ``T`` queries over ``kv_len`` keys, each requiring a
    gradient where ``requires`` says so."""
    HQ, H = heads
    DK, DV = dims
    like = dict(dtype=dtype, device=device)
    tensors = (torch.randn(1, T, HQ, DK, **like), torch.randn(1, kv_len, H, DK, **like),
               torch.randn(1, kv_len, H, DV, **like), torch.rand(1, T, HQ, 3, **like))
    return [t.requires_grad_(r) for t, r in zip(tensors, requires)]


@pytest.mark.triton
@pytest.mark.parametrize(
    "case",
    [
        # one case a graph: shared keys (compressed by mean_compress in the graph), their own, and
        # no attention gradient (each case a training step twice under the interpreter)
        pytest.param(dict(q_offset=32), id="shared-kv-mean-compressed-forced-in-window-q-offset"),
        pytest.param(dict(own_kv=True, dims=(32, 16)), id="own-cmp-and-win-kv-dk32-dv16"),
        pytest.param(dict(requires=(False, False, False, True)), id="gates-only"),
    ],
)
def test_fullgraph_training_on_triton_is_eager_training(case, nsa_device):
    """On the Triton route a compiled training step holds ``nsa.attention_train`` forward and
    ``nsa.attention_train_backward`` backward, and gives eager's output and every gradient
    bitwise (the same kernels on the same tensors)."""
    from nsa.ops.window.kernel import forced_in_window  # a Triton module: imported where Triton runs

    q_offset = case.get("q_offset", 0)
    assert forced_in_window(SMALL, 2, q_offset)  # taken where the window reads (k, v)
    T = 41  # 5 selection blocks with the offset: a real top-4 (the kernels' own tests take longer rows)
    q, k, v, gates = _triton_inputs(T, T + q_offset, dims=case.get("dims", (16, 16)),
                                    requires=case.get("requires", (True,) * 4), device=nsa_device)
    extra = {}
    if case.get("own_kv"):
        k_cmp, v_cmp = (ops.mean_compress(t, SMALL).detach().requires_grad_() for t in (k, v))
        extra = dict(kv_cmp=(k_cmp, v_cmp), kv_win=tuple(t.detach().clone().requires_grad_() for t in (k, v)))
    leaves = [t for t in (q, k, v, gates, *extra.get("kv_cmp", ()), *extra.get("kv_win", ())) if t.requires_grad]
    grad_out = torch.randn(1, T, 4, v.shape[-1], device=nsa_device)

    def f(q, k, v, gates):
        return nsa_attention(q, k, v, gates * 0.5, SMALL, q_offset=q_offset, backend="triton", **extra) * 2

    backend, graphs = _recording_backend()
    results = {}
    for name, fn in (("eager", f), ("compiled", torch.compile(f, backend=backend, fullgraph=True))):
        out = fn(q, k, v, gates)
        results[name] = [out, *torch.autograd.grad(out, leaves, grad_out)]
    assert all(torch.equal(a, b) for a, b in zip(results["compiled"], results["eager"]))
    compressing = ["nsa.mean_compress"] * 2 * (not case.get("own_kv"))
    assert _nsa_nodes(graphs["forward"]) == compressing + ["nsa.attention_train"]
    attention_grads = any(t.requires_grad for t in (q, k, v))
    assert _nsa_nodes(graphs["backward"]) == ["nsa.attention_train_backward"] + [
        "nsa.mean_compress_backward"] * (2 * attention_grads) * (not case.get("own_kv"))


@pytest.mark.skipif("reason" not in __import__("inspect").signature(torch.compiler.disable).parameters,
                    reason="torch.compiler.disable takes no reason before torch 2.8")
def test_fullgraph_refuses_a_reference_gradient_and_says_why():
    """A gradient on the reference route runs the eager op (a graph break): ``fullgraph=True``
    refuses it, and Dynamo's message says what runs eagerly and where to read why."""
    call, (q, k, v, gates) = _op_calls()["nsa_attention"]
    q.requires_grad_()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"a gradient on a route that is not Triton's"):
        torch.compile(call, backend="aot_eager", fullgraph=True)(q, k, v, gates)


def test_an_invalid_argument_fails_compiled_with_the_ops_own_message():
    """The custom op's implementation runs the eager op's checks: a bad argument raises the same
    error, naming it, compiled or not."""
    call, (q, k, v, gates) = _op_calls()["nsa_attention"]
    for fn in (call, torch.compile(call, backend="aot_eager", fullgraph=True)):
        with pytest.raises(ValueError, match=r"gates must have shape .* = \[1, 70, 4, 3\], got \[1, 70, 2, 3\]"):
            fn(q, k, v, gates[:, :, :2])


@pytest.mark.parametrize("compression", ["mlp", "mean"])
def test_export_holds_the_layer_for_any_batch_and_length(compression):
    """``torch.export`` of a layer (inference, float64, reference route) with a dynamic batch and
    length: the program holds NSA as custom ops and gives the layer's output at other shapes."""
    layer = _layer(compression=compression).requires_grad_(False)
    # from the shortest length with two compressed tokens (README, Known limits)
    shortest = SMALL.cmp_block + SMALL.cmp_stride
    batch, length = torch.export.Dim("batch", max=16), torch.export.Dim("length", min=shortest, max=4096)
    program = torch.export.export(layer, (torch.randn(2, 90, 64, dtype=torch.float64),),
                                  dynamic_shapes={"x": {0: batch, 1: length}})
    nodes = _nsa_nodes([program.graph_module])
    # one RoPE table rotates the queries and every branch's keys
    rotations = ["nsa.rope_tables"] + ["nsa.rotary"] * 4
    assert nodes == rotations + ["nsa.mean_compress"] * 2 * (compression == "mean") + ["nsa.attention"]
    for shape in ((1, 90), (3, 107), (2, shortest)):
        x = torch.randn(*shape, 64, dtype=torch.float64)
        assert torch.equal(program.module()(x), layer(x))


def test_one_dynamic_graph_serves_every_batch_and_length():
    """``torch.compile(layer, dynamic=True, fullgraph=True)`` traces one graph, with symbolic batch
    and length, whose results at three shapes are the eager layer's (inference, reference route)."""
    layer = _layer()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(layer, dynamic=True, fullgraph=True, backend=record)
    with torch.no_grad():
        # batches from 2: a batch of 1 is a graph of its own (Dynamo specializes sizes 0 and 1)
        for shape in ((2, 40), (3, 90), (4, 133)):
            x = torch.randn(*shape, 64, dtype=torch.float64)
            assert torch.equal(compiled(x), layer(x))
    assert len(graphs) == 1


@pytest.mark.triton
def test_fullgraph_layer_on_triton_trains_and_decodes_as_eager(nsa_device, monkeypatch):
    """``torch.compile(layer, fullgraph=True)`` on the Triton route (float32): the training step
    (output, input and parameter gradients) and prefill plus decode steps through a static cache
    equal the eager layer's, bitwise. Compiled, the decode steps' learnable compression runs as
    modules, which Inductor fuses, and so do the gates; eager, in three launches of its own
    (:mod:`nsa.ops.decode.mlp_emission`), and the gates in the decode op's last launch
    (:mod:`nsa.ops.gates.projection`), whose products sum in another order: those steps are
    bitwise the eager layer's with both turned off, and close to its own."""
    import nsa.ops.decode.mlp_emission as mlp_emission

    layer = _layer(device=nsa_device, dtype=torch.float32, backend="triton")
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    x = torch.randn(1, 50, 64, device=nsa_device, requires_grad=True)
    assert all(torch.equal(a, b) for a, b in zip(_train(compiled, x), _train(layer, x)))
    max_rows, step_gates = mlp_emission.MAX_ROWS, NSAAttention._step_gates
    with torch.no_grad():
        steps = {}
        for name, model, launches in (("eager", layer, True), ("eager, modules", layer, False),
                                      ("compiled", compiled, True)):  # fmt: skip
            monkeypatch.setattr(mlp_emission, "MAX_ROWS", max_rows if launches else 0)
            monkeypatch.setattr(NSAAttention, "_step_gates", step_gates if launches else NSAAttention._gates)
            cache = layer.new_cache(batch_size=1, capacity=96, static=True)
            steps[name] = [model(x[:, :44], cache)] + [model(x[:, t : t + 1], cache) for t in (44, 45)]
    assert all(torch.equal(a, b) for a, b in zip(steps["compiled"], steps["eager, modules"]))
    assert torch.equal(steps["compiled"][0], steps["eager"][0])  # the prefill
    for a, b in zip(steps["compiled"][1:], steps["eager"][1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_compiled_code_around_the_triton_op_on_the_gpu_equals_eager(nsa_device):
    """With Inductor on the GPU (bf16, the Triton route), code around ``nsa_attention`` compiles
    into one graph with the op's custom ops, and the op gives eager's output and gradients,
    bitwise: the same kernels run on the same inputs. Before, Dynamo captured its Triton kernels,
    and Inductor failed to recompile the first one (the compressed forward: its float scale typed
    float64)."""
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
    out = torch.compile(f, fullgraph=True)(*inputs)
    got = [out, *torch.autograd.grad(out, inputs, grad_out)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
def test_reduce_overhead_replays_the_triton_training_op_in_cuda_graphs(nsa_device):
    """``mode="reduce-overhead"`` (CUDA graphs over compiled code: the remedy for short sequences,
    whose calls the host's launches bound; docs/perf/compile.md) captures the training custom ops'
    kernels, forward and backward: Inductor records graphs and skips no run (it raises where it
    would), and every replay gives eager's output and gradients, bitwise."""
    from torch._dynamo.utils import counters
    from torch._inductor import config

    torch.manual_seed(0)
    like = dict(device=nsa_device, dtype=torch.bfloat16)
    inputs = [torch.randn(1, 300, 16, 64, **like), *(torch.randn(1, 300, 2, 64, **like) for _ in range(2)),
              torch.rand(1, 300, 16, 3, **like)]  # fmt: skip
    inputs = [t.requires_grad_() for t in inputs]
    grad_out = torch.randn(1, 300, 16, 64, **like)

    def f(q, k, v, gates):
        return nsa_attention(q, k, v, gates * 0.5, SMALL) * 2

    eager = f(*inputs)
    want = [eager, *torch.autograd.grad(eager, inputs, grad_out)]
    compiled = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    with config.patch({"triton.cudagraph_or_error": True}):
        for _ in range(3):  # a warm-up run, the recording, a replay
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(*inputs)
            got = [out.clone(), *(g.clone() for g in torch.autograd.grad(out, inputs, grad_out))]
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert recorded_cuda_graphs(nsa_device) >= 2  # the forward's graph and the backward's


@pytest.mark.gpu
def test_reduce_overhead_layer_trains_as_the_default_compiled_layer(nsa_device):
    """A whole layer (bf16, Triton route) under ``mode="reduce-overhead"``: output, input and
    parameter gradients equal the default-mode compiled layer's, bitwise (CUDA graphs replay the
    same kernels), over three steps, with no run outside CUDA graphs."""
    from torch._dynamo.utils import counters
    from torch._inductor import config

    layer = _layer(device=nsa_device, dtype=torch.bfloat16, heads=(16, 2), head_dim=64)
    x = torch.randn(1, 300, 64, device=nsa_device, dtype=torch.bfloat16, requires_grad=True)
    want = _train(torch.compile(layer, fullgraph=True), x)
    torch._dynamo.reset()
    counters.clear()
    graphed = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    with config.patch({"triton.cudagraph_or_error": True}):
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            got = [t.clone() for t in _train(graphed, x)]
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert recorded_cuda_graphs(nsa_device) >= 2


@pytest.mark.gpu
def test_reduce_overhead_decodes_into_a_static_cache_in_cuda_graphs(nsa_device):
    """Prefill and 16 decode steps of a layer compiled with ``mode="reduce-overhead"`` on a static
    cache (bf16, Triton route). The cache marks its buffers as static addresses, so Inductor's CUDA
    graphs write each step into them in place: no run skipped for mutating its inputs (before,
    every step was), the steps replay a few recorded graphs instead of recording one each, and
    every output equals the default-mode compiled layer's, bitwise."""
    from torch._dynamo.utils import counters
    from torch._inductor import config

    layer = _layer(device=nsa_device, dtype=torch.bfloat16, heads=(16, 2), head_dim=64)
    x = torch.randn(1, 80, 64, device=nsa_device, dtype=torch.bfloat16)

    def steps(model):
        cache = layer.new_cache(batch_size=1, capacity=96, static=True)
        with torch.no_grad():
            out = [model(x[:, :64], cache).clone()]
            for t in range(64, 80):
                torch.compiler.cudagraph_mark_step_begin()
                out.append(model(x[:, t : t + 1], cache).clone())
        return out

    want = steps(torch.compile(layer, fullgraph=True))
    torch._dynamo.reset()
    counters.clear()
    with config.patch({"triton.cudagraph_or_error": True}):
        got = steps(torch.compile(layer, mode="reduce-overhead", fullgraph=True))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert 1 <= recorded_cuda_graphs(nsa_device) <= 4
