"""The whole NSA prefill on Triton (fused compressed attention + selection, selected,
window, mean compression) against the float64 reference: output, blocks and every gradient.

On CPU this runs through Triton's interpreter at small sizes; the ``gpu`` case runs a
real size in bfloat16 against a float32 reference.
"""

from __future__ import annotations

import pytest
import torch

from nsa import NSAConfig, nsa_attention
from nsa.testing import assert_close

pytestmark = [pytest.mark.triton, pytest.mark.parity]

SMALL = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=24)


def _run(q, k, v, gates, config, backend, do):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, gates)]
    o, block_idx = nsa_attention(*leaves[:4], config, backend=backend, return_block_idx=True)
    (o.double() * do).sum().backward()
    return o, block_idx, [x.grad for x in leaves]


def _check(B, T, HQ, H, DK, DV, config, dtype, ref_dtype, device, tol):
    q = torch.randn(B, T, HQ, DK, device=device, dtype=dtype)
    k = torch.randn(B, T, H, DK, device=device, dtype=dtype)
    v = torch.randn(B, T, H, DV, device=device, dtype=dtype)
    gates = torch.rand(B, T, HQ, 3, device=device, dtype=dtype)
    do = torch.randn(B, T, HQ, DV, device=device, dtype=torch.float64)
    o, blocks, grads = _run(q, k, v, gates, config, "triton", do)
    ref_o, ref_blocks, ref_grads = _run(*(x.to(ref_dtype) for x in (q, k, v, gates)), config, "reference", do)
    assert o.dtype == dtype
    # Random inputs leave no exact ties, so the blocks agree everywhere.
    agree = (blocks == ref_blocks).all(-1).double().mean().item()
    assert agree >= 0.99, f"selected blocks agree on only {agree:.2%} of rows"
    assert_close("o", o, ref_o, tol(dtype, "fwd"))
    for name, got, want in zip(("dq", "dk", "dv", "dgates"), grads, ref_grads):
        assert_close(name, got, want, tol(dtype, "grad"))


@pytest.mark.parametrize(
    "B, T, HQ, H, DK, DV",
    [
        pytest.param(1, 91, 4, 1, 16, 16, id="B1-T91-HQ4-H1-D16"),
        pytest.param(2, 70, 4, 2, 32, 16, id="B2-T70-HQ4-H2-DK32-DV16"),
    ],
)
def test_nsa_attention_triton_matches_reference(B, T, HQ, H, DK, DV, nsa_device, nsa_tolerance):
    _check(B, T, HQ, H, DK, DV, SMALL, torch.float32, torch.float64, nsa_device, nsa_tolerance)


@pytest.mark.gpu
def test_nsa_attention_triton_bf16_real_size(nsa_device, nsa_tolerance):
    _check(1, 4096 + 77, 64, 4, 128, 128, NSAConfig(), torch.bfloat16, torch.float32, nsa_device, nsa_tolerance)


def _inference_and_training(T, HQ, H, D, config, dtype, device):
    """``nsa_attention`` without a gradient (the window kernel sums the branches) and with
    one (window, then the separate gated sum), on the same inputs."""
    q = torch.randn(1, T, HQ, D, device=device, dtype=dtype)
    k = torch.randn(1, T, H, D, device=device, dtype=dtype)
    v = torch.randn(1, T, H, D, device=device, dtype=dtype)
    gates = torch.rand(1, T, HQ, 3, device=device, dtype=dtype)
    with torch.no_grad():
        fused = nsa_attention(q, k, v, gates, config, backend="triton")
    trained = nsa_attention(q.requires_grad_(), k, v, gates, config, backend="triton")
    return fused, trained


def test_inference_sums_the_branches_in_the_window_kernel(nsa_device, monkeypatch):
    """Without a gradient the window kernel writes the gated sum itself: the same output,
    bitwise, as the window branch followed by the gated sum (taken when q needs a gradient),
    and that path is only taken when both ops run on Triton."""
    from nsa.ops.window import kernel

    calls = []
    real = kernel.window_gated_sum
    monkeypatch.setattr(kernel, "window_gated_sum", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    fused, trained = _inference_and_training(83, 4, 2, 16, SMALL, torch.float32, nsa_device)
    assert len(calls) == 1 and torch.equal(fused, trained.detach())
    monkeypatch.setenv("NSA_BACKEND", "triton")
    monkeypatch.setenv("NSA_BACKEND_GATES", "reference")
    with torch.no_grad():
        q = torch.randn(1, 40, 4, 16, device=nsa_device)
        nsa_attention(q, q[:, :, :2], q[:, :, :2], torch.rand(1, 40, 4, 3, device=nsa_device), SMALL)
    assert len(calls) == 1  # the reference gated sum takes o_win: the window kernel does not sum


@pytest.mark.gpu
def test_inference_gated_sum_real_size(nsa_device):
    fused, trained = _inference_and_training(4096 + 77, 64, 4, 128, NSAConfig(), torch.bfloat16, nsa_device)
    assert torch.equal(fused, trained.detach())


def _composed_ops(q, k, v, gates, config, kv_cmp, kv_win):
    """``nsa_attention`` as the ops' own autograd Functions, one after the other: what
    :mod:`nsa.ops.training` replaces in training."""
    from nsa.ops.combine import composed_branches

    return composed_branches(q, k, v, gates, *kv_cmp, *kv_win, config, 0, "triton")


@pytest.mark.parametrize(
    "T, HQ, H, D, config, dtype, own_window_kv",
    [
        pytest.param(83, 4, 2, 16, SMALL, torch.float32, False, id="cpu-shared-kv"),
        pytest.param(70, 4, 1, 16, SMALL, torch.float32, True, id="cpu-own-window-kv"),
        pytest.param(4096 + 77, 64, 4, 128, NSAConfig(), torch.bfloat16, False, marks=pytest.mark.gpu, id="gpu-bf16"),
    ],
)
def test_training_function_equals_the_composed_ops(T, HQ, H, D, config, dtype, own_window_kv, nsa_device, monkeypatch):
    """Training runs one autograd Function (the gates' backward hands each branch its softmax
    delta, the dQ kernels add into one ``dq``). Same kernels forward: ``o`` and the blocks
    bitwise equal those of the composed ops. Backward: every gradient, of ``k_cmp``/``v_cmp``
    and a window's own ``(k, v)`` too, equals the composed ops' up to the order of the sums
    (float32 rounding), or bf16 rounding at real size."""
    from nsa.ops import mean_compress, training

    calls = []
    real = training.NSATrainingFunction.apply
    monkeypatch.setattr(training.NSATrainingFunction, "apply", lambda *a: (calls.append(1), real(*a))[1])
    x = [torch.randn(1, T, n, D, device=nsa_device, dtype=dtype) for n in (HQ, H, H, H, H)]
    x.insert(3, torch.rand(1, T, HQ, 3, device=nsa_device, dtype=dtype))
    leaves = [t.requires_grad_() for t in x]  # q, k, v, gates, k_win, v_win
    q, k, v, gates, k_win, v_win = leaves
    kv_cmp = (mean_compress(k, config, backend="triton"), mean_compress(v, config, backend="triton"))
    kv_win = (k_win, v_win) if own_window_kv else (k, v)
    do = torch.randn(1, T, HQ, D, device=nsa_device, dtype=dtype)
    outputs = {}
    for name in ("one function", "composed"):
        if name == "one function":
            o, idx = nsa_attention(q, k, v, gates, config, kv_cmp=kv_cmp, kv_win=kv_win if own_window_kv else None,
                                   backend="triton", return_block_idx=True)
        else:
            o, idx = _composed_ops(q, k, v, gates, config, kv_cmp, kv_win)
        grads = torch.autograd.grad(o, leaves if own_window_kv else leaves[:4], do)
        outputs[name] = (o, idx, grads)
    assert calls == [1]
    (o, idx, grads), (o_ref, idx_ref, grads_ref) = outputs["one function"], outputs["composed"]
    assert torch.equal(o, o_ref) and torch.equal(idx, idx_ref)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for name, got, want in zip(("dq", "dk", "dv", "dgates", "dk_win", "dv_win"), grads, grads_ref):
        assert_close(name, got, want, tol)


def test_training_function_skips_the_branches_for_a_gates_only_gradient(nsa_device, monkeypatch):
    """When only the gates need a gradient, the one Function's backward is the gates' alone (as
    with the composed ops, whose branch Functions would not even be recorded): no branch
    backward runs, and ``dgates`` equals the composed ops'."""
    from nsa.ops import mean_compress, training

    calls = []
    real = training.NSATrainingFunction.apply
    monkeypatch.setattr(training.NSATrainingFunction, "apply", lambda *a: (calls.append("function"), real(*a))[1])
    for name in ("compressed_bwd", "selected_bwd", "window_bwd"):
        monkeypatch.setattr(training, name, lambda *a, name=name, **k: calls.append(name))
    q, k, v = (torch.randn(1, 50, n, 16, device=nsa_device) for n in (4, 2, 2))
    gates = torch.rand(1, 50, 4, 3, device=nsa_device, requires_grad=True)
    do = torch.randn(1, 50, 4, 16, device=nsa_device)
    (got,) = torch.autograd.grad(nsa_attention(q, k, v, gates, SMALL, backend="triton"), gates, do)
    kv_cmp = (mean_compress(k, SMALL, backend="triton"), mean_compress(v, SMALL, backend="triton"))
    (want,) = torch.autograd.grad(_composed_ops(q, k, v, gates, SMALL, kv_cmp, (k, v))[0], gates, do)
    assert calls == ["function"] and torch.equal(got, want)
