"""The whole NSA prefill on Triton (fused compressed attention + selection, selected,
window, mean compression) against the float64 reference: the selected blocks (the reference's
own but for near-ties, ``nsa.testing.assert_valid_selection``), then the output and every
gradient against the reference given those blocks.

On CPU this runs through Triton's interpreter at small sizes; the ``gpu`` case runs a
real size in bfloat16 against a float32 reference.
"""

from __future__ import annotations

import pytest
import torch

from _kernel_inputs import nsa_run, reference_selection
from nsa import NSAConfig, nsa_attention
from nsa.ops._triton.device import sized_as
from nsa.testing import SELECTION_EPS, assert_close, assert_valid_selection

pytestmark = [pytest.mark.triton, pytest.mark.parity]

SMALL = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=24)
#: SMALL with a window that holds the local blocks (window >= local_blocks * sel_block): the window
#: kernel then computes the selected branch's forced blocks (NSA_FORCED_IN_WINDOW)
SMALL_FORCED = NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=32)


def _check(B, T, HQ, H, DK, DV, config, dtype, ref_dtype, device, tol):
    """The kernels' blocks are a valid top-n of the reference's scores (the reference's own but for
    near-ties), and their output and gradients match the reference given those blocks."""
    q = torch.randn(B, T, HQ, DK, device=device, dtype=dtype)
    k = torch.randn(B, T, H, DK, device=device, dtype=dtype)
    v = torch.randn(B, T, H, DV, device=device, dtype=dtype)
    gates = torch.rand(B, T, HQ, 3, device=device, dtype=dtype)
    do = torch.randn(B, T, HQ, DV, device=device, dtype=torch.float64)
    o, blocks, grads = nsa_run(q, k, v, gates, config, "triton", do)
    assert o.dtype == dtype
    up = [x.to(ref_dtype) for x in (q, k, v, gates)]
    assert_valid_selection(blocks, *reference_selection(up[0], up[1], config), config, eps=SELECTION_EPS[dtype])
    ref_o, _, ref_grads = nsa_run(*up, config, "reference", do, block_idx=blocks)
    assert_close("o", o, ref_o, tol(dtype, "fwd"))
    for name, got, want in zip(("dq", "dk", "dv", "dgates"), grads, ref_grads):
        assert_close(name, got, want, tol(dtype, "grad"))


@pytest.mark.parametrize(
    "B, T, HQ, H, DK, DV, config",
    [
        pytest.param(1, 91, 4, 1, 16, 16, SMALL, id="B1-T91-HQ4-H1-D16"),
        pytest.param(2, 70, 4, 2, 32, 16, SMALL, id="B2-T70-HQ4-H2-DK32-DV16"),
        pytest.param(2, 70, 4, 2, 32, 16, SMALL_FORCED, id="B2-T70-HQ4-H2-DK32-DV16-forced-in-window"),
    ],
)
def test_nsa_attention_triton_matches_reference(B, T, HQ, H, DK, DV, config, nsa_device, nsa_tolerance):
    _check(B, T, HQ, H, DK, DV, config, torch.float32, torch.float64, nsa_device, nsa_tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "T, HQ, H",
    [
        # the float32 reference recomputes its query chunks in the backward: 2-3.2 GiB a case (H100,
        # session 31), where keeping them took 35 GiB
        pytest.param(4096 + 77, 64, 4, id="T4173-HQ64-H4"),
        # one KV head: a swapped block counts for all 16 heads of a row; against the reference's own
        # blocks, the 0.9 % of rows that near-ties swap give o a 1.1e-2 error by themselves
        pytest.param(4096 + 77, 16, 1, id="T4173-HQ16-H1"),
        pytest.param(4096 + 15, 16, 4, id="T4111-G4"),
    ],
)
def test_nsa_attention_triton_bf16_real_size(T, HQ, H, nsa_device, nsa_tolerance):
    _check(1, T, HQ, H, 128, 128, NSAConfig(), torch.bfloat16, torch.float32, nsa_device, nsa_tolerance)


@pytest.mark.parametrize("gpu", ["a100", "rtx4090"])
@pytest.mark.parametrize("DK, DV", [(16, 16), (192, 128)], ids=["D16", "DK192-DV128"])
def test_nsa_attention_sized_for_other_gpus(gpu, DK, DV, nsa_device, nsa_tolerance):
    """The launches an A100 or a consumer GPU makes (no bulk copies, their tiles and stages:
    ``tests/ops/test_launch_sizing.py``) compute the same prefill, forward and gradients."""
    if nsa_device.type == "cuda":
        pytest.skip("small float32 sizes run under the interpreter; the GPU runs the _real_size variant")
    with sized_as(gpu):
        _check(1, 61, 4, 1, DK, DV, SMALL_FORCED, torch.float32, torch.float64, nsa_device, nsa_tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("gpu", ["a100", "rtx4090"])
@pytest.mark.parametrize(
    "T, HQ, H, DK, DV",
    [
        # 2.1 GiB with the float32 reference recomputing its chunks (session 31), 51 keeping them
        pytest.param(3001, 16, 16, 128, 128, id="T3001-G1-D128"),
        pytest.param(2053, 16, 1, 192, 128, id="T2053-G16-DK192-DV128"),
    ],
)
def test_nsa_attention_sized_for_other_gpus_real_size(gpu, T, HQ, H, DK, DV, nsa_device, nsa_tolerance):
    """The same in bf16 at real sizes, on whatever GPU runs the suite (compiled for it, so this
    checks what the launches compute; whether they fit the other GPU, the sm_80/sm_89 compiles of
    ``scripts/launch_resources.py`` checked, docs/perf/other_gpus.md)."""
    with sized_as(gpu):
        _check(1, T, HQ, H, DK, DV, NSAConfig(), torch.bfloat16, torch.float32, nsa_device, nsa_tolerance)


def _inference_and_training(T, HQ, H, D, config, dtype, device):
    """``nsa_attention`` without a gradient (the window kernel sums the branches) and with
    one (the training Function, whose window kernel also keeps its own output), on the same inputs."""
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
    bitwise, as training's (see also :func:`test_window_forward_sums_and_keeps_its_output`),
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
        pytest.param(70, 4, 2, 16, SMALL, torch.float32, False, id="cpu-shared-kv"),  # 5 blocks: a real top-4
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

    # the composed ops run the forced-block kernel; so does the Function here (see
    # test_forced_blocks_in_the_window_kernel for the window's share of them)
    monkeypatch.setenv("NSA_FORCED_IN_WINDOW", "0")
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


def _branches_forward(T, HQ, H, D, config, dtype, device):
    """Inputs and forward results of the three branches, as the training Function saves them."""
    from nsa.ops import mean_compress
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.selected.kernel import selected_fwd
    from nsa.ops.window.kernel import window_fwd

    q, k, v = (torch.randn(1, T, n, D, device=device, dtype=dtype) for n in (HQ, H, H))
    k_cmp, v_cmp = (mean_compress(x, config, backend="triton") for x in (k, v))
    scale, forced = config.softmax_scale(D), (config.init_blocks, config.local_blocks)
    o_cmp, lse_cmp, idx = compressed_fwd(q, k_cmp, v_cmp, config, scale, 0, select=True)
    o_slc, lse_slc = selected_fwd(q, k, v, idx, config.sel_block, scale, 0, forced=forced)
    o_win, lse_win = window_fwd(q, k, v, config.window, scale, 0)
    return dict(q=q, k=k, v=v, k_cmp=k_cmp, v_cmp=v_cmp, idx=idx, scale=scale, forced=forced,
                o=(o_cmp, o_slc, o_win), lse=(lse_cmp, lse_slc, lse_win))


def _branch_backwards(x, config):
    """Each branch's backward launcher as ``run(do, delta, **kw)`` (``delta`` None: computed)."""
    from nsa.ops.compressed.kernel import compressed_bwd
    from nsa.ops.selected.kernel import selected_bwd
    from nsa.ops.window.kernel import window_bwd

    q, k, v, scale = x["q"], x["k"], x["v"], x["scale"]
    (o_cmp, o_slc, o_win), (lse_cmp, lse_slc, lse_win) = x["o"], x["lse"]
    return {
        "compressed": lambda do, delta, **kw: compressed_bwd(q, x["k_cmp"], x["v_cmp"], o_cmp, lse_cmp, do, None,
                                                             config, scale, 0, delta=delta, **kw),
        "selected": lambda do, delta, **kw: selected_bwd(q, k, v, x["idx"], o_slc, lse_slc, do, config.sel_block, scale,
                                                         0, forced=x["forced"], delta=delta, **kw),
        "window": lambda do, delta, **kw: window_bwd(q, k, v, o_win, lse_win, do, config.window, scale, 0, delta=delta,
                                                     **kw),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_branch_backwards_apply_their_gate(dtype, nsa_device):
    """Given its gates (``gate=``) and the gated sum's ``do``, a branch's backward scales its
    probabilities by the gate: the gradients of the branch's own ``g * do`` (which the gates'
    backward then need not write), with the gates' row sums ``rowsum(o * do)`` as deltas or
    its own. float32 agrees to rounding; float16 differs by the rounding of ``g * do`` to 16
    bits, which the gated path skips. G = 3 pads head rows, D = 24 columns."""
    from nsa.ops.gates.kernel import gates_bwd

    x = _branches_forward(61, 6, 2, 24, SMALL, dtype, nsa_device)
    gates = torch.rand(1, 61, 6, 3, device=nsa_device, dtype=dtype)
    do = torch.randn_like(x["o"][0])
    dgates, *do_branch, _ = gates_bwd(gates, *x["o"], do)
    dgates_only, *unstored, delta = gates_bwd(gates, *x["o"], do, with_delta=True, store_do=False)
    assert unstored == [None] * 3 and torch.equal(dgates_only, dgates)
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    gate = gates.float().permute(3, 0, 1, 2).contiguous()
    for i, (name, run) in enumerate(_branch_backwards(x, SMALL).items()):
        want = run(do_branch[i], None)
        for delta_i in (delta[i], None):
            got = run(do, delta_i, gate=gate[i])
            for grad, a, b in zip(("dq", "dk", "dv"), got, want):
                assert_close(f"{name} {grad}", a, b, tol)


def test_branch_backwards_check_their_gate(nsa_device):
    """A gate must be one contiguous float32 row per query head (what the kernels load beside
    lse), and it scales the output's gradient only: the compressed backward refuses it
    together with an lse gradient."""
    from nsa.ops.compressed.kernel import compressed_bwd

    x = _branches_forward(40, 4, 2, 16, SMALL, torch.float32, nsa_device)
    gates = torch.rand(1, 40, 4, 3, device=nsa_device)
    do = torch.randn_like(x["o"][0])
    for name, run in _branch_backwards(x, SMALL).items():
        with pytest.raises(ValueError, match="contiguous float32"):
            run(do, None, gate=gates[..., 0])  # a column of the gates: strided
        with pytest.raises(ValueError, match=r"gate must be \[B, T, HQ\]"):
            run(do, None, gate=gates[:, :20, :, 0])
    with pytest.raises(ValueError, match="pass one of gate and dlse"):
        compressed_bwd(x["q"], x["k_cmp"], x["v_cmp"], x["o"][0], x["lse"][0], do, torch.randn_like(x["lse"][0]),
                       SMALL, x["scale"], 0, gate=gates[..., 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_window_forward_sums_and_keeps_its_output(dtype, nsa_device):
    """Training's window launch writes the gated sum beside its own output and lse: the sum
    bitwise the separate gates kernel's, the window's ``o``/``lse`` bitwise ``window_fwd``'s."""
    from nsa.ops.gates.kernel import gates_fwd
    from nsa.ops.window.kernel import window_fwd_summed

    x = _branches_forward(61, 6, 2, 24, SMALL, dtype, nsa_device)
    gates = torch.rand(1, 61, 6, 3, device=nsa_device, dtype=dtype)
    o_cmp, o_slc, o_win = x["o"]
    o, o_win_kept, lse = window_fwd_summed(x["q"], x["k"], x["v"], SMALL.window, x["scale"], 0, gates, o_cmp, o_slc)
    assert torch.equal(o_win_kept, o_win) and torch.equal(lse, x["lse"][2])
    assert torch.equal(o, gates_fwd(gates, o_cmp, o_slc, o_win))


def _forced_only(T, q_offset, H, config, device):
    """Block lists of the forced blocks alone (initial, then local; -1 padding) for every query."""
    t = q_offset + torch.arange(T, device=device)
    own = t // config.sel_block
    n = config.init_blocks + config.local_blocks
    idx = torch.full((1, T, H, n), -1, dtype=torch.int32, device=device)
    for i in range(config.init_blocks):
        idx[0, :, :, i] = torch.where(own >= i, i, -1)[:, None].to(torch.int32)
    for i in range(config.local_blocks):
        j = own - i
        keep = (j >= config.init_blocks)
        idx[0, :, :, config.init_blocks + i] = torch.where(keep, j, -1)[:, None].to(torch.int32)
    return idx


@pytest.mark.parametrize(
    "T, HQ, H, D, q_offset, config",
    [
        pytest.param(83, 4, 2, 16, 0, SMALL_FORCED, id="G2"),
        pytest.param(70, 4, 1, 24, 16, SMALL_FORCED, id="G4-D24-q_offset16"),
        pytest.param(61, 1, 1, 16, 0, SMALL_FORCED, id="G1"),
        pytest.param(77, 4, 2, 16, 0, NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=6, window=48,
                                                 init_blocks=2, local_blocks=3), id="init2-local3"),
        pytest.param(77, 4, 2, 16, 0, NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=16,
                                                 init_blocks=0, local_blocks=1), id="init0-local1"),
    ],
)
def test_forced_blocks_in_the_window_kernel(T, HQ, H, D, q_offset, config, nsa_device):
    """``window_fwd_forced``: the window's ``o``/``lse`` equal ``window_fwd``'s (float32 rounding:
    it walks the tiles in another order), and the state it leaves is the selected branch's
    attention over the forced blocks alone, from which ``selected_fwd`` finishes the branch
    as it does after its own forced-block kernel."""
    from nsa.ops.selected import reference as selected_reference
    from nsa.ops.selected.kernel import selected_fwd
    from nsa.ops.window.kernel import forced_in_window, window_fwd, window_fwd_forced

    assert forced_in_window(config, HQ // H, q_offset)
    TK = q_offset + T
    q = torch.randn(1, T, HQ, D, device=nsa_device)
    k, v = (torch.randn(1, TK, H, D, device=nsa_device) for _ in range(2))
    scale = config.softmax_scale(D)
    o_win, lse_win, o_frc, lse_frc = window_fwd_forced(q, k, v, config, scale, q_offset)
    want_o, want_lse = window_fwd(q, k, v, config.window, scale, q_offset)
    assert_close("o_win", o_win, want_o, 1e-5)
    assert_close("lse_win", lse_win, want_lse, 1e-5)
    idx = _forced_only(T, q_offset, H, config, nsa_device)
    want_frc = selected_reference.selected_attention(q.double(), k.double(), v.double(), idx, config,
                                                     scale, q_offset)
    assert_close("o_frc", o_frc, want_frc, 1e-5)
    # a full selection (forced blocks and random others) finishes from that state
    blocks = torch.randint(0, TK // config.sel_block + 1, (1, T, H, config.sel_count), device=nsa_device)
    blocks[..., : idx.shape[-1]] = idx
    blocks = blocks.to(torch.int32)
    forced = (config.init_blocks, config.local_blocks)
    got, got_lse = selected_fwd(q, k, v, blocks, config.sel_block, scale, q_offset, forced=forced,
                                start=(o_frc, lse_frc))
    want, want_lse = selected_fwd(q, k, v, blocks, config.sel_block, scale, q_offset, forced=forced)
    assert_close("o_slc", got, want, 1e-5)
    assert_close("lse_slc", got_lse, want_lse, 1e-5)


def test_forced_in_window_applies_only_where_exact(nsa_device, monkeypatch):
    """The window kernels take the forced blocks (forward and dQ) only where it is exact and the
    flag allows: not with a window narrower than the local blocks, a selection block they cannot
    tile, no local block, or a ``q_offset`` that splits a tile over two selection blocks. Off,
    ``nsa_attention`` runs the forced-block kernels: the same output and gradients up to float32
    rounding."""
    from nsa.ops import training
    from nsa.ops.window import kernel

    assert kernel.forced_in_window(SMALL_FORCED, 2, 0)
    assert not kernel.forced_in_window(SMALL, 2, 0)  # window 24 < 2 blocks of 16
    assert not kernel.forced_in_window(NSAConfig(sel_block=128), 16, 0)
    assert not kernel.forced_in_window(NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=32,
                                                 local_blocks=0), 2, 0)
    assert not kernel.forced_in_window(SMALL_FORCED, 16, 2)  # 4 positions a tile
    with pytest.raises(ValueError, match="q_offset=2 must be a multiple"):
        # 16-bit: 4 positions a tile of 64 rows (exact float32 takes tiles of one position)
        q = torch.randn(1, 8, 16, 16, device=nsa_device, dtype=torch.float16)
        kernel.window_fwd_forced(q, q[:, :, :1], q[:, :, :1], SMALL_FORCED, 0.25, 2)
    calls = []
    real = kernel.window_fwd_forced
    counted = lambda *a, **k: (calls.append(1), real(*a, **k))[1]  # noqa: E731
    monkeypatch.setattr(kernel, "window_fwd_forced", counted)
    monkeypatch.setattr(training, "window_fwd_forced", counted)
    backwards = []
    real_bwd = training.window_bwd
    monkeypatch.setattr(training, "window_bwd",
                        lambda *a, **k: (backwards.append(k["forced"] is not None), real_bwd(*a, **k))[1])
    x = [torch.randn(1, 41, n, 16, device=nsa_device) for n in (4, 2, 2)]
    gates = torch.rand(1, 41, 4, 3, device=nsa_device)
    do = torch.randn(1, 41, 4, 16, device=nsa_device)
    outputs, grads = [], []
    for flag in ("1", "0"):
        monkeypatch.setenv("NSA_FORCED_IN_WINDOW", flag)
        with torch.no_grad():
            outputs.append(nsa_attention(*x, gates, SMALL_FORCED, backend="triton"))
        leaves = [t.clone().requires_grad_() for t in x]
        o = nsa_attention(*leaves, gates, SMALL_FORCED, backend="triton")
        grads.append(torch.autograd.grad(o, leaves, do))
        outputs.append(o.detach())
    assert calls == [1, 1] and backwards == [True, False]
    assert torch.equal(outputs[0], outputs[1])  # inference and training: the same kernels
    assert_close("o", outputs[0], outputs[2], 1e-5)
    assert torch.equal(outputs[2], outputs[3])
    for name, got, want in zip(("dq", "dk", "dv"), *grads):
        assert_close(name, got, want, 1e-5)


@pytest.mark.parametrize(
    "T, HQ, H, D, q_offset, config",
    [
        pytest.param(83, 4, 2, 16, 0, SMALL_FORCED, id="G2"),
        pytest.param(70, 4, 1, 24, 16, SMALL_FORCED, id="G4-D24-q_offset16"),
        pytest.param(77, 2, 2, 16, 0, NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=6, window=48,
                                                 init_blocks=2, local_blocks=3), id="G1-init2-local3"),
    ],
)
def test_forced_blocks_backward_in_the_window_kernels(T, HQ, H, D, q_offset, config, nsa_device):
    """The window's backward with ``forced=`` adds the selected branch's forced-block share (``dq``
    over every forced block, ``dk``/``dv`` over the local ones) and the selected backward with
    ``forced_done`` leaves it out: together, every gradient equals the two branches' own
    backwards (float32 rounding), gated, and ``dkv=`` adds into the selected branch's dK/dV. Both
    walks of the dK/dV kernel's band: from its start, and phased (from a phase point, wrapping;
    16-key tiles)."""
    from nsa.ops.selected.kernel import selected_bwd, selected_fwd
    from nsa.ops.window.kernel import window_bwd, window_fwd

    TK = q_offset + T
    q = torch.randn(1, T, HQ, D, device=nsa_device)
    k, v = (torch.randn(1, TK, H, D, device=nsa_device) for _ in range(2))
    do = torch.randn(1, T, HQ, D, device=nsa_device)
    gate = torch.rand(2, 1, T, HQ, device=nsa_device)
    scale, forced = config.softmax_scale(D), (config.init_blocks, config.local_blocks)
    blocks = torch.randint(0, TK // config.sel_block + 1, (1, T, H, config.sel_count), device=nsa_device)
    n_forced = config.init_blocks + config.local_blocks
    blocks[..., :n_forced] = _forced_only(T, q_offset, H, config, nsa_device)
    blocks = blocks.to(torch.int32)
    o_slc, lse_slc = selected_fwd(q, k, v, blocks, config.sel_block, scale, q_offset, forced=forced)
    o_win, lse_win = window_fwd(q, k, v, config.window, scale, q_offset)
    delta = [torch.randn(1, T, HQ, device=nsa_device) for _ in range(2)]  # any deltas: both paths take them
    want_slc = selected_bwd(q, k, v, blocks, o_slc, lse_slc, do, config.sel_block, scale, q_offset, forced=forced,
                            delta=delta[0], gate=gate[0])
    want_win = window_bwd(q, k, v, o_win, lse_win, do, config.window, scale, q_offset, delta=delta[1], gate=gate[1])
    for walk, tiles in (("from the start", None), ("phased", {"dkdv": dict(BN=16, PHASED=True)})):
        dq = torch.zeros_like(q)
        _, dk, dv = selected_bwd(q, k, v, blocks, o_slc, lse_slc, do, config.sel_block, scale, q_offset,
                                 forced=forced, delta=delta[0], dq=dq, gate=gate[0], forced_done=True)
        got = window_bwd(q, k, v, o_win, lse_win, do, config.window, scale, q_offset, delta=delta[1], dq=dq,
                         gate=gate[1], forced=dict(config=config, lse=lse_slc, delta=delta[0], gate=gate[0]),
                         dkv=(dk, dv), tiles=tiles)
        assert got[1] is dk and got[2] is dv
        for name, g, a, b in zip(("dq", "dk", "dv"), got, want_slc, want_win):
            assert_close(f"{name}, the band walked {walk}", g, a + b, 1e-5)
    with pytest.raises(ValueError, match="dkv must be contiguous tensors shaped like k"):
        window_bwd(q, k, v, o_win, lse_win, do, config.window, scale, q_offset, dkv=(dk[:, :-1], dv))
