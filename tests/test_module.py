"""NSAAttention: decode == prefill through the cache, gradients of every parameter."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from nsa import NSAAttention, NSAConfig, nsa_attention
from nsa.modules import MLPCompression
from nsa.testing import assert_close

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)


def _layer(compression: str = "mlp", heads=(4, 2), dims=(8, 6), dtype=torch.float64, device=None) -> NSAAttention:
    layer = NSAAttention(24, heads[0], heads[1], dims[0], dims[1], SMALL, compression=compression)
    return layer.to(device=device, dtype=dtype)


def _decode_all(layer: NSAAttention, x: torch.Tensor, prefill: int, step: int, chunk: int):
    """Prefill ``prefill`` tokens, then feed the rest ``step`` tokens at a time."""
    cache = layer.new_cache(x.shape[0], chunk=chunk)
    outs, blocks = [], []
    bounds = ([prefill] if prefill else []) + list(range(prefill + step, x.shape[1], step)) + [x.shape[1]]
    start = 0
    for end in bounds:
        outs.append(layer(x[:, start:end], cache))
        blocks.append(cache.last_block_idx)
        start = end
    return torch.cat(outs, 1), torch.cat(blocks, 1), cache


@pytest.mark.parity
@pytest.mark.parametrize("compression", ["mlp", "mean"])
@pytest.mark.parametrize(
    "prefill, step",
    [
        pytest.param(0, 1, id="decode-only"),
        pytest.param(1, 1, id="prefill1"),
        pytest.param(4, 1, id="prefill-stride"),
        pytest.param(7, 1, id="prefill7"),
        pytest.param(8, 1, id="prefill-selblock"),
        pytest.param(13, 3, id="prefill13-step3"),
        pytest.param(32, 1, id="prefill32"),
        pytest.param(45, 5, id="prefill45-step5"),
    ],
)
def test_decode_equals_prefill(compression: str, prefill: int, step: int) -> None:
    layer = _layer(compression)
    x = torch.randn(2, 77, 24, dtype=torch.float64)
    prefill_cache = layer.new_cache(2)
    full = layer(x, prefill_cache)
    assert torch.equal(layer(x), full), "a whole-sequence forward must not depend on the cache"
    out, blocks, cache = _decode_all(layer, x, prefill, step, chunk=16)
    assert (out - full).abs().max() < 1e-12
    assert torch.equal(blocks, prefill_cache.last_block_idx)
    assert cache.length == 77 and cache.num_cmp == SMALL.num_cmp(77)


@pytest.mark.gradcheck
def test_gradcheck_compression_weights(nsa_gradcheck_tolerance) -> None:
    """float64 gradcheck through the learnable phi into every NSA branch."""
    B, T, HQ, H, D = 1, 30, 2, 1, 4
    phi_k, phi_v = MLPCompression(D, SMALL, hidden=6).double(), MLPCompression(D, SMALL, hidden=6).double()
    q, k, v = (torch.randn(B, T, h, D, dtype=torch.float64) for h in (HQ, H, H))
    gates = torch.rand(B, T, HQ, 3, dtype=torch.float64)
    names_k = [n for n, _ in phi_k.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in (*phi_k.parameters(), *phi_v.parameters())]

    def run(*flat):
        pk = dict(zip(names_k, flat[: len(names_k)]))
        pv = dict(zip(names_k, flat[len(names_k) :]))
        kv_cmp = (functional_call(phi_k, pk, (k,)), functional_call(phi_v, pv, (v,)))
        return nsa_attention(q, k, v, gates, SMALL, kv_cmp=kv_cmp, backend="reference")

    assert torch.autograd.gradcheck(run, params, **nsa_gradcheck_tolerance)


@pytest.mark.parametrize("compression", ["mlp", "mean"])
def test_every_parameter_gets_gradient(compression: str) -> None:
    layer = _layer(compression)
    x = torch.randn(2, 70, 24, dtype=torch.float64)
    layer(x).square().sum().backward()
    for name, param in layer.named_parameters():
        assert param.grad is not None, f"{name} received no gradient"
        assert param.grad.abs().sum() > 0, f"{name} received an all-zero gradient"
    for name, rows in layer.projection_rows().items():  # each projection that in_proj stacks
        assert layer.in_proj.weight.grad[rows].abs().amin(1).gt(0).all(), f"a row of {name} got no gradient"


def test_a_state_dict_of_separate_projections_loads_into_in_proj() -> None:
    """A layer saved before ``in_proj`` (separate ``q_proj``, ``k_proj.<branch>``,
    ``v_proj.<branch>`` weights) loads, inside a model too, with its weights stacked in
    :meth:`NSAAttention.projection_rows` order, and computes what the separate products did."""
    layer = _layer("mlp")
    old = {k: v for k, v in layer.state_dict().items() if k != "in_proj.weight"}
    separate = {name: torch.randn(rows.stop - rows.start, 24, dtype=torch.float64)
                for name, rows in layer.projection_rows().items()}  # fmt: skip
    old["q_proj.weight"] = separate["q"]
    for kind in "kv":
        for b in ("cmp", "slc", "win"):
            old[f"{kind}_proj.{b}.weight"] = separate[f"{kind}_{b}"]
    model = nn.Sequential(layer)
    model.load_state_dict({f"0.{k}": v for k, v in old.items()})
    x = torch.randn(1, 40, 24, dtype=torch.float64)
    for name, rows in layer.projection_rows().items():
        assert torch.equal(layer.in_proj.weight[rows], separate[name]), name
        torch.testing.assert_close(layer.in_proj(x)[..., rows], x @ separate[name].T, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="Missing key.*in_proj.weight"):
        _layer("mlp").load_state_dict({k: v for k, v in old.items() if k != "v_proj.win.weight"})


@pytest.mark.parametrize("dims", [(8, 6), (8, 8)], ids=["dk8-dv6", "dk8-dv8"])
def test_a_decode_steps_views_equal_the_copies_with_one_rotation(dims, monkeypatch) -> None:
    """A decode step's projection as views (queries and keys rotated as one tensor of
    ``HQ + 3 H`` heads, values left in the product) gives the queries, keys and values of the
    copies, bit for bit, with one rotation launch instead of four; batches at different positions."""
    layer = _layer(heads=(4, 2), dims=dims)
    x = torch.randn(3, 2, 24, dtype=torch.float64)
    positions = torch.tensor([[5, 6], [40, 41], [0, 1]])
    rotations = []
    real = layer.rotary.rotate
    monkeypatch.setattr(layer.rotary, "rotate", lambda t, tables: (rotations.append(t.shape[2]), real(t, tables))[1])
    q, keys, values = layer._queries_keys_values(x, positions, views=True)
    assert rotations == [4 + 3 * 2]
    rotations.clear()
    want_q, want_keys, want_values = layer._queries_keys_values(x, positions)
    assert rotations == [4, 2, 2, 2]
    assert torch.equal(q, want_q) and q.shape == (3, 2, 4, 8)
    for b in ("cmp", "slc", "win"):
        assert torch.equal(keys[b], want_keys[b]) and torch.equal(values[b], want_values[b]), b
        assert values[b].shape == (3, 2, 2, dims[1]) and not values[b].is_contiguous()  # in the product


def test_gqa_group_sizes_and_dk_ne_dv() -> None:
    for heads in [(4, 4), (4, 2), (4, 1), (16, 1)]:
        layer = _layer(heads=heads, dims=(8, 4))
        out = layer(torch.randn(2, 41, 24, dtype=torch.float64))
        assert out.shape == (2, 41, 24) and torch.isfinite(out).all()


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ValueError, match="num_kv_heads"):
        NSAAttention(24, 4, 3, 8, config=SMALL)
    with pytest.raises(ValueError, match="compression"):
        NSAAttention(24, 4, 2, 8, config=SMALL, compression="max")
    with pytest.raises(ValueError, match="even head_dim"):
        NSAAttention(24, 4, 2, 7, config=SMALL)
    with pytest.raises(ValueError, match=r"x must be \[B, T, 24\]"):
        _layer()(torch.randn(2, 5, 23, dtype=torch.float64))


@pytest.mark.parametrize("compression", ["mlp", "mean"])
def test_packed_sequences_equal_each_sequence_alone(compression: str) -> None:
    """``cu_seqlens``: every sequence of the pack gets its own positions and compressed
    tokens; outputs, input gradients and parameter gradients equal separate runs."""
    layer = _layer(compression)
    lengths = [19, 0, 5, 40]
    cu = torch.tensor([0, 19, 19, 24, 64], dtype=torch.int32)
    x = torch.randn(1, sum(lengths), 24, dtype=torch.float64, requires_grad=True)
    out = layer(x, cu_seqlens=cu, max_seqlen=40)
    do = torch.randn_like(out)
    (out * do).sum().backward()
    packed_grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer.zero_grad()
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if a == b:
            continue
        x_i = x.detach()[:, a:b].clone().requires_grad_()
        o_i = layer(x_i)
        (o_i * do[:, a:b]).sum().backward()
        torch.testing.assert_close(out[:, a:b], o_i, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x.grad[:, a:b], x_i.grad, rtol=1e-12, atol=1e-12)
    for name, p in layer.named_parameters():  # the separate runs accumulated their gradients
        torch.testing.assert_close(packed_grads[name], p.grad, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name}: {m}")


def test_packed_sequences_refuse_a_growing_cache_and_bad_packs() -> None:
    """A pack fills only an empty static cache (tests/test_decode_graph.py has the rest)."""
    layer = _layer("mean")
    x = torch.randn(1, 10, 24, dtype=torch.float64)
    cu = torch.tensor([0, 4, 10])
    with pytest.raises(ValueError, match="prompts of different lengths go into an empty static cache"):
        layer(x, layer.new_cache(2), cu_seqlens=cu)
    with pytest.raises(ValueError, match="max_seqlen needs cu_seqlens"):
        layer(x, max_seqlen=10)
    with pytest.raises(ValueError, match="cu_seqlens must rise from 0 to the packed length 10"):
        layer(x, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="max_seqlen must be an int >= the longest sequence"):
        layer(x, cu_seqlens=cu, max_seqlen=5)
    with pytest.raises(ValueError, match="packed as \\[1, total"):
        layer(x.expand(2, 10, 24), cu_seqlens=cu)


@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
def test_decode_under_autocast_follows_its_prefill(static: bool, nsa_tolerance) -> None:
    """float32 weights under ``torch.autocast`` (bfloat16): the cache made there holds
    bfloat16, as the projections give, and decode steps equal the prefill's rows. Before,
    the cache took the weights' float32 and the first call raised on the mismatch. (On the
    CPU, where a token's projection rounds alike in a prefill and in a step; a GPU's matrix
    products may not, and at a random initialisation near-tied blocks then swap.)"""
    layer = _layer(dtype=torch.float32)
    x = torch.randn(1, 90, 24)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = layer(x)
        cache = layer.new_cache(1, capacity=96, static=static)
        steps = torch.cat([layer(x[:, :80], cache)] + [layer(x[:, t : t + 1], cache) for t in range(80, 90)], 1)
    assert cache.dtype == torch.bfloat16 and full.dtype == steps.dtype == torch.bfloat16
    assert_close("o", steps, full, nsa_tolerance(torch.bfloat16))


def test_a_cache_of_another_dtype_is_refused_before_anything_is_written() -> None:
    layer = _layer(dtype=torch.float32)
    cache = layer.new_cache(1)  # outside autocast: the weights' float32
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(TypeError, match=r"cache holds torch.float32 .* torch.bfloat16 \(torch.autocast\).*new_cache"):
            layer(torch.randn(1, 20, 24), cache)
    assert cache.length == 0 and cache.num_cmp == 0
    layer(torch.randn(1, 20, 24), cache)  # and it still serves calls of its own dtype


def test_training_under_autocast_reaches_every_parameter(nsa_device) -> None:
    layer = _layer(dtype=torch.float32, device=nsa_device)
    x = torch.randn(1, 70, 24, device=nsa_device, requires_grad=True)
    with torch.autocast(nsa_device.type, dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().square().mean().backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.gpu
def test_decode_steps_under_autocast_on_the_gpu(nsa_device) -> None:
    """The same on the GPU, by the Triton route: a static cache made under autocast holds
    bfloat16, prompts and graph-safe steps run, every output finite."""
    layer = _layer(dtype=torch.float32, device=nsa_device)
    x = torch.randn(2, 90, 24, device=nsa_device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        cache = layer.new_cache(2, capacity=96, static=True)
        outs = [layer(x[:, :80], cache)] + [layer(x[:, t : t + 1], cache) for t in range(80, 90)]
    assert cache.dtype == torch.bfloat16 and cache.seq_lens.tolist() == [90, 90]
    assert all(o.dtype == torch.bfloat16 and torch.isfinite(o).all() for o in outs)


def test_activation_checkpointing_gives_the_same_gradients(nsa_device, nsa_tolerance) -> None:
    """``torch.utils.checkpoint`` over the layer (non-reentrant): its backward runs the forward
    again, and every gradient equals the plain layer's (float64 on the CPU: bitwise)."""
    from torch.utils.checkpoint import checkpoint

    dtype = torch.float64 if nsa_device.type == "cpu" else torch.bfloat16
    layer = _layer(dtype=dtype, device=nsa_device)
    x = torch.randn(1, 90, 24, device=nsa_device, dtype=dtype)
    grads = {}
    for name, run in (("plain", layer), ("checkpointed", lambda t: checkpoint(layer, t, use_reentrant=False))):
        xi = x.clone().requires_grad_()
        y = run(xi)
        grads[name] = torch.autograd.grad(y.float().square().mean(), [xi, *layer.parameters()])
    largest = max(float(g.float().norm()) for g in grads["plain"])
    for got, want in zip(grads["checkpointed"], grads["plain"]):
        if dtype == torch.float64:
            assert torch.equal(got, want)
        elif float(want.float().norm()) > 1e-4 * largest:  # not the key compression's last bias,
            assert_close("grad", got, want, nsa_tolerance(dtype, "grad"))  # zero but for rounding


def test_rotary_angles_stay_float64_in_a_16_bit_layer() -> None:
    """``layer.to(torch.bfloat16)`` keeps every position its own angle. With the frequencies in
    a buffer, the cast rounded them and the positions to bfloat16, past 256 several positions
    shared one angle (1001 -> 1000), and the rotated keys were 64 % off at 4k tokens."""
    from nsa.modules import RotaryEmbedding

    x = torch.randn(1, 4096, 2, 16).to(torch.bfloat16)
    positions = torch.arange(4096)
    want = RotaryEmbedding(16)(x.double(), positions)
    assert_close("rope", RotaryEmbedding(16).to(torch.bfloat16)(x, positions), want, 1e-2)
    layer = _layer(dtype=torch.bfloat16)
    assert all(buf.dtype != torch.bfloat16 or buf.numel() == 0 for buf in layer.buffers())


def test_a_layer_made_on_the_meta_device_loads_a_state_dict() -> None:
    """Large models are built on ``meta``, moved with ``to_empty`` and loaded: nothing of the
    layer may live outside its state dict (a non-persistent frequency buffer stayed garbage)."""
    real = _layer()
    with torch.device("meta"):
        empty = _layer()
    empty = empty.to_empty(device="cpu")
    empty.load_state_dict(real.state_dict())
    x = torch.randn(1, 300, 24, dtype=torch.float64)
    assert torch.equal(empty(x), real(x))


@pytest.mark.gpu
@pytest.mark.requires(gpu_count=2)
def test_a_layer_on_another_gpu_than_the_current_one_runs_there() -> None:
    """A model spread over GPUs in one process: the layer on ``cuda:1`` while ``cuda:0`` is
    current. Triton launches on the current device, so the ops make their tensors' device
    current first; forward and gradients equal the same layer's on ``cuda:0``."""
    torch.cuda.set_device(0)
    results = []
    for device in ("cuda:0", "cuda:1"):
        torch.manual_seed(0)  # the same weights on both GPUs
        layer = _layer(dtype=torch.bfloat16, device=device)
        x = torch.randn(1, 300, 24, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
        x.requires_grad_()
        y = layer(x)
        grads = torch.autograd.grad(y.float().square().mean(), [x, *layer.parameters()])
        results.append([t.cpu() for t in (y, *grads)])
    assert torch.cuda.current_device() == 0
    assert all(torch.equal(a, b) for a, b in zip(*results))


class _QuantizedStandIn(nn.Module):
    """A projection whose stored weight is not floating point (as a 4-bit or 8-bit layer's is)
    and that computes in float32."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.inner = linear.in_features, linear
        self.weight = nn.Parameter(torch.zeros(linear.weight.shape, dtype=torch.uint8), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_a_quantized_projection_takes_the_cache_dtype_it_is_given() -> None:
    """With a quantized ``in_proj`` the layer cannot know its keys' dtype: ``new_cache`` asks for
    it, by name, and a cache given one serves decode as with plain weights."""
    layer = _layer(dtype=torch.float32)
    x = torch.randn(1, 40, 24)
    with torch.no_grad():
        plain_cache = layer.new_cache(1)
        want = [layer(x[:, :30], plain_cache), layer(x[:, 30:31], plain_cache)]
        layer.in_proj = _QuantizedStandIn(layer.in_proj)
        with pytest.raises(TypeError, match=r"torch.uint8 \(quantized\?\).*new_cache\(dtype=\.\.\.\)"):
            layer.new_cache(1)
        cache = layer.new_cache(1, dtype=torch.float32)
        got = [layer(x[:, :30], cache), layer(x[:, 30:31], cache)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
