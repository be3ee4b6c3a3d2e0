"""Gates given to the decode op as their projection (:mod:`nsa.ops.gates.projection`): the Triton
combine launch computes them from the hidden state. Against the same op given the gates the
modules compute: float32 through the interpreter on the CPU, bf16 at the benchmark layer's size
on a GPU (with and without programmatic dependent launch); where the layer passes them so."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nsa import NSAAttention, NSAConfig
from nsa.ops import mean_compress
from nsa.ops.decode import nsa_decode
from nsa.ops.gates.projection import GateProjection

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=3, window=8)


def _inputs(B, Tq, HQ, H, D, hidden, lens, config, device, dtype):
    cap = max(lens) + 3
    like = dict(device=device, dtype=dtype)
    q = torch.randn(B, Tq, HQ, D, **like)
    k, v, k_win, v_win = (torch.randn(B, cap, H, D, **like) for _ in range(4))
    seq_lens = torch.tensor(lens, device=device, dtype=torch.int32)
    x = torch.randn(B, Tq, hidden, **like)
    proj = nn.Linear(hidden, 3 * HQ).to(device, dtype)
    kv = dict(kv_cmp=(mean_compress(k, config), mean_compress(v, config)), kv_win=(k_win, v_win))
    return q, k, v, seq_lens, x, proj, kv


@pytest.mark.triton
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_decode_computes_gates_given_as_their_projection(backend, bias, nsa_device) -> None:
    """Two sequences of two new tokens (rows of the combine launch in different sequences and
    positions), 8 query heads (two combine programs a row on the CPU), a hidden width that fills
    no tile: the output equals the op's given the modules' gates, within 1e-6 in float32 (the
    reference evaluates the projection first: bitwise)."""
    if nsa_device.type == "cuda":
        pytest.skip("float32 through the interpreter; the GPU case is below")
    torch.manual_seed(0)
    q, k, v, seq_lens, x, proj, kv = _inputs(2, 2, 8, 2, 16, 40, [50, 33], SMALL, nsa_device, torch.float32)
    gates = GateProjection(x, proj.weight.detach(), proj.bias.detach() if bias else None)
    with torch.no_grad():
        got, got_idx = nsa_decode(q, k, v, gates, seq_lens, SMALL, backend=backend, return_block_idx=True, **kv)
        want, want_idx = nsa_decode(q, k, v, gates.evaluate(8), seq_lens, SMALL, backend=backend,
                                    return_block_idx=True, **kv)  # fmt: skip
    assert torch.equal(got_idx, want_idx)
    if backend == "reference":
        assert torch.equal(got, want)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_decode_names_a_bad_gate_projection() -> None:
    q, k, v, seq_lens, x, proj, kv = _inputs(1, 1, 4, 2, 8, 24, [20], SMALL, torch.device("cpu"), torch.float32)
    w, b = proj.weight.detach(), proj.bias.detach()
    with pytest.raises(ValueError, match=r"gates.weight must be a contiguous torch.float32 tensor of shape \[12, 24\], got torch.float32 \[12, 23\]"):
        nsa_decode(q, k, v, GateProjection(x, w[:, :23].contiguous(), b), seq_lens, SMALL, **kv)
    with pytest.raises(ValueError, match=r"gates.bias must be a contiguous torch.float32 tensor of shape \[12\], got torch.float64"):
        nsa_decode(q, k, v, GateProjection(x, w, b.double()), seq_lens, SMALL, **kv)
    with pytest.raises(ValueError, match=r"gates.x must have 3 dims"):
        nsa_decode(q, k, v, GateProjection(x[0], w, b), seq_lens, SMALL, **kv)
    with pytest.raises(RuntimeError, match="nsa_decode has no backward"):
        nsa_decode(q, k, v, GateProjection(x, proj.weight, proj.bias), seq_lens, SMALL, **kv)


def _layer_and_cache(device: torch.device, dtype: torch.dtype, backend: str):
    torch.manual_seed(1)
    layer = NSAAttention(32, 4, 2, 8, config=SMALL, backend=backend).to(device, dtype)
    return layer, layer.new_cache(2, capacity=40, static=True)


@pytest.mark.triton
def test_decode_steps_pass_the_gate_projection_where_it_computes_the_modules_gates(monkeypatch, nsa_device) -> None:
    """On the Triton route a device step gives the decode op its gates as their projection, and
    its output is the reference route's (float32, the interpreter). Prefills, the reference
    route, a gradient wanted and autocast compute the gates as modules."""
    if nsa_device.type == "cuda":
        pytest.skip("float32 layers on the CPU, through the interpreter; the GPU's steps are test_decode_graph's")
    import nsa.modules.attention as attention

    kinds = []
    real = attention.nsa_decode
    def spy(q, k, v, gates, *args, **kwargs):
        kinds.append(type(gates))
        return real(q, k, v, gates, *args, **kwargs)

    monkeypatch.setattr(attention, "nsa_decode", spy)
    outputs = {}
    for route in ("triton", "reference"):
        layer, cache = _layer_and_cache(torch.device("cpu"), torch.float32, route)
        with torch.no_grad():
            layer(torch.randn(2, 20, 32), cache)  # a prefill (past DEVICE_STEP_MAX_TOKENS)
            outputs[route] = layer(torch.randn(2, 1, 32), cache)
    assert kinds == [GateProjection, torch.Tensor]  # the step on each route; the prefills call no decode
    torch.testing.assert_close(outputs["triton"], outputs["reference"], rtol=1e-5, atol=1e-5)
    layer, _ = _layer_and_cache(torch.device("cpu"), torch.float32, "triton")
    x = torch.randn(2, 1, 32)
    assert isinstance(layer._step_gates(x), torch.Tensor)  # parameters that want a gradient
    with torch.no_grad():
        assert isinstance(layer._step_gates(x), GateProjection)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert isinstance(layer._step_gates(x), torch.Tensor)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parametrize("batch", [1, 16])
def test_decode_gate_projection_at_the_benchmark_sizes(batch, nsa_device) -> None:
    """bf16, 64 query heads, 4 KV heads, head dim 128, hidden 2048, 8k cache: the selected blocks
    equal those of the op given the modules' gates, the output is as close to it as one rounding
    of a gate allows, and programmatic dependent launch on or off changes nothing (bitwise)."""
    config = NSAConfig()
    torch.manual_seed(2)
    lens = [8192 - 17 * i for i in range(batch)]
    q, k, v, seq_lens, x, proj, kv = _inputs(batch, 1, 64, 4, 128, 2048, lens, config, nsa_device, torch.bfloat16)
    gates = GateProjection(x, proj.weight.detach(), proj.bias.detach())
    with torch.no_grad():
        want, want_idx = nsa_decode(q, k, v, gates.evaluate(64), seq_lens, config, return_block_idx=True, **kv)
        runs = []
        for pdl in (True, False, True):
            from nsa.ops.decode.kernel import decode_fwd

            runs.append(decode_fwd(q, k, v, gates, seq_lens, *kv["kv_cmp"], *kv["kv_win"], config,
                                   config.softmax_scale(128), pdl=pdl))  # fmt: skip
    for o, idx in runs:
        assert torch.equal(o, runs[0][0]) and torch.equal(idx, runs[0][1])
    assert torch.equal(runs[0][1], want_idx)
    # a gate one bf16 rounding off moves its branch's share of the output by at most 2**-8 of it
    err = (runs[0][0].float() - want.float()).abs().max() / want.float().abs().max()
    assert float(err) <= 1e-2, float(err)
