"""Packed variable-length batches: ``nsa_attention(..., cu_seqlens=...)`` equals running each
sequence alone from position 0, outputs, selected blocks and gradients; bad packs are refused
with the argument named."""

from __future__ import annotations

import pytest
import torch

from nsa import NSAConfig
from nsa.ops import nsa_attention
from nsa.ops.varlen import cu_seqlens_of

CONFIG = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4, window=16)
HQ, H, D = 4, 2, 16


def _packed_inputs(lengths, dtype, device):
    total = sum(lengths)
    q = torch.randn(1, total, HQ, D, dtype=dtype, device=device)
    k = torch.randn(1, total, H, D, dtype=dtype, device=device)
    v = torch.randn(1, total, H, D, dtype=dtype, device=device)
    gates = torch.rand(1, total, HQ, 3, dtype=dtype, device=device)
    cu = cu_seqlens_of(lengths).to(device)
    return [q, k, v, gates], cu


def _grads(inputs, run):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    o, idx = run(*inputs)
    do = torch.randn_like(o)
    (o * do).sum().backward()
    return o, idx, [x.grad for x in inputs], do


def check_pack(lengths, backend, dtype, device, tol):
    inputs, cu = _packed_inputs(lengths, dtype, device)
    o, idx, grads, do = _grads(inputs, lambda *x: nsa_attention(*x, CONFIG, backend=backend, cu_seqlens=cu,
                                                                return_block_idx=True))
    assert o.shape == (1, sum(lengths), HQ, D) and idx.shape == (1, sum(lengths), H, CONFIG.sel_count)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        if a == b:
            continue
        one = [x[:, a:b].detach().clone().requires_grad_() for x in inputs]
        o_i, idx_i = nsa_attention(*one, CONFIG, backend=backend, return_block_idx=True)
        (o_i * do[:, a:b]).sum().backward()
        assert torch.equal(idx[:, a:b], idx_i), f"sequence {i}: blocks differ"
        torch.testing.assert_close(o[:, a:b], o_i, rtol=tol, atol=tol)
        for name, g, x in zip(("dq", "dk", "dv", "dgates"), grads, one):
            torch.testing.assert_close(g[:, a:b], x.grad, rtol=tol, atol=tol, msg=lambda m: f"sequence {i} {name}: {m}")


def test_packed_equals_each_sequence_reference():
    """Empty sequences, one shorter than a compressed block, others past several selection blocks."""
    check_pack([37, 0, 80, 5, 64], "reference", torch.float64, "cpu", 1e-12)


@pytest.mark.triton
@pytest.mark.parity
def test_packed_equals_each_sequence_triton(nsa_device):
    """Through the Triton kernels (the interpreter on a CPU); three length classes and an empty
    sequence (which the fuzzer's packed draws do not hold)."""
    check_pack([40, 0, 23, 9], "triton", torch.float32, nsa_device, 2e-5)


def test_packed_of_empty_sequences_only():
    check_pack([0, 0], "reference", torch.float64, "cpu", 1e-12)


def test_packed_runs_one_padded_batch_per_length_class(monkeypatch):
    """Sequences run in batches of their length class, by default half an octave wide
    ``(2^((c-1)/2), 2^(c/2)]``, each padded to its longest member (so by less than sqrt(2) times
    a sequence's length), not all to the pack's longest; the result still equals each sequence
    alone (outputs, blocks, gradients)."""
    from nsa.ops import combine, varlen

    lengths = [3, 100, 0, 5, 60, 1, 64, 33]
    assert varlen.CLASSES_PER_OCTAVE == 2
    assert varlen.length_classes(lengths) == [[5], [0], [3], [7], [4, 6], [1]]
    assert varlen.length_classes(lengths, 1) == [[5], [0], [3], [4, 6, 7], [1]]  # octaves: 33 padded to 64
    shapes = []
    real = combine.nsa_attention
    def spy(q, *args, **kwargs):
        shapes.append(tuple(q.shape[:2]))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(combine, "nsa_attention", spy)
    check_pack(lengths, "reference", torch.float64, "cpu", 1e-12)
    assert shapes[:6] == [(1, 1), (1, 3), (1, 5), (1, 33), (2, 64), (1, 100)]  # then check_pack's runs alone
    assert sum(n * t for n, t in shapes[:6]) == 270  # of 266 real positions; 301 by octaves, 800 by the longest


@pytest.mark.parametrize("per_octave", [1, 2, 4])
@pytest.mark.parametrize("lengths", [[0, 0], [7], [4, 4, 0, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 1000], list(range(100, 400, 7))])
def test_length_classes_pad_less_than_a_class_width(lengths, per_octave):
    """Every non-empty sequence is in exactly one class, and no member is padded to
    ``2 ** (1 / per_octave)`` times its length (twice it for the default one class an octave)."""
    from nsa.ops import varlen

    classes = varlen.length_classes(lengths, per_octave)
    assert sorted(i for c in classes for i in c) == [i for i, n in enumerate(lengths) if n > 0]
    for members in classes:
        longest = max(lengths[j] for j in members)
        assert all(longest ** per_octave < 2 * lengths[i] ** per_octave for i in members)
        assert members == sorted(members)
    if per_octave > 1 and len(lengths) > 20:  # narrower classes split what one octave holds
        assert len(classes) > len(varlen.length_classes(lengths, 1))


def test_length_class_borders_are_exact():
    """Borders at ``2 ** (c / per_octave)`` compare in integers: sqrt(2) * 128 = 181.02..."""
    from nsa.ops import varlen

    assert [varlen.length_class(n, 2) for n in (128, 129, 181, 182, 256)] == [14, 15, 15, 16, 16]
    assert [varlen.length_class(n, 1) for n in (1, 2, 3, 64, 65)] == [0, 1, 2, 6, 7]
    for bad in (0, 1.5, True, None):
        with pytest.raises(ValueError, match="per_octave must be an int >= 1"):
            varlen.length_classes([3, 4], bad)


def _layout(lengths):
    from nsa.ops import varlen

    cu = cu_seqlens_of(lengths)
    return varlen.layout(cu, None, sum(lengths), 1, torch.device("cpu")), cu.tolist()


@pytest.mark.parametrize("per_octave", [1, 2, 3])
def test_layout_slots_cover_the_pack_once(per_octave):
    """On random packs: every group's real and padded slots split its batch exactly; a real slot
    reads its own position; ``pack_source`` is every batch row holding a real position, each once."""
    from nsa.ops import varlen

    gen = torch.Generator().manual_seed(per_octave)
    for _ in range(20):
        lengths = torch.randint(0, 300, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
        cu = cu_seqlens_of(lengths)
        pack = varlen.layout(cu, None, sum(lengths), 1, torch.device("cpu"), per_octave)
        rows, offset = [], 0
        for g in pack.groups:
            slots = torch.cat([g.real_slots, g.pad_slots]).sort().values
            assert torch.equal(slots, torch.arange(g.n * g.longest))
            assert torch.equal(g.source[g.real_slots], g.positions)
            rows.append(g.real_slots + offset)
            offset += g.n * g.longest
        assert torch.equal(pack.pack_source.sort().values, torch.cat(rows).sort().values)
        assert torch.equal(torch.cat([g.positions for g in pack.groups]).sort().values, torch.arange(sum(lengths)))
        assert offset ** per_octave < 2 * sum(lengths) ** per_octave or sum(lengths) == 0


def test_pad_and_unpad_gradients_equal_each_sequence_alone():
    """A causal op (a running sum over time) on the padded batches: outputs and input gradients
    equal the op on each sequence alone, bitwise. Pad's backward takes each position's gradient
    from its real slot only, and unpad's backward zeroes the padded slots (``new_empty`` comes
    NaN-filled in tests, so a slot left unwritten would show)."""
    lengths = [3, 100, 0, 5, 60, 1, 64, 33]
    pack, cu = _layout(lengths)
    assert len(pack.groups) == 6 and any(g.n > 1 for g in pack.groups)  # one group padded (60 to 64)
    x = torch.randn(1, sum(lengths), 2, 3, dtype=torch.float64, requires_grad=True)
    dout = torch.randn_like(x)
    y = pack.unpad([p.cumsum(1) for p in pack.pad(x)])
    (y * dout).sum().backward()
    for a, b in zip(cu[:-1], cu[1:]):
        alone = x[:, a:b].detach().clone().requires_grad_()
        (alone.cumsum(1) * dout[:, a:b]).sum().backward()
        assert torch.equal(y[:, a:b], alone.cumsum(1))
        assert torch.equal(x.grad[:, a:b], alone.grad)


def test_pad_backward_with_groups_left_out():
    """Positions of a group whose padded batch gets no gradient get zeros, not an empty tensor's."""
    lengths = [3, 100, 5, 60]
    pack, cu = _layout(lengths)
    x = torch.randn(1, sum(lengths), 4, dtype=torch.float64, requires_grad=True)
    pads = pack.pad(x)
    sum(p.sum() for p in pads[1:]).backward()  # the first group (length 3) left out
    counts = torch.zeros(sum(lengths), dtype=torch.float64)
    for g in pack.groups[1:]:
        counts[g.positions] = 1.0
    assert counts[:3].sum() == 0 and counts.sum() < sum(lengths)
    # a padded slot repeats its sequence's last token, but pad's backward passes real slots only
    torch.testing.assert_close(x.grad[0], counts[:, None].expand(-1, 4), rtol=0, atol=0)


@pytest.mark.gpu
def test_packed_step_with_host_boundaries_never_waits_for_the_gpu(nsa_device):
    """With ``cu_seqlens`` on the host, a packed forward and backward through the Triton kernels
    make no synchronising call (torch's sync debug mode raises on one); boundaries on the GPU are
    read back once, which that mode reports."""
    lengths = [300, 1000, 77, 2048, 129]
    inputs, cu = _packed_inputs(lengths, torch.bfloat16, nsa_device)
    config = NSAConfig()
    inputs = [x.requires_grad_() for x in inputs]
    do = torch.randn_like(inputs[0])

    def step(boundaries):
        return torch.autograd.grad(nsa_attention(*inputs, config, cu_seqlens=boundaries), inputs, do)

    host = cu.cpu()
    expected = step(host)  # compiles the kernels outside the debug mode
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grads = step(host)
        with pytest.raises(RuntimeError, match="synchroniz"):
            step(cu)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def test_layouts_are_kept_by_boundary_values():
    """Layers sharing a pack build its layout once: equal boundaries (another tensor, dtype or
    device) give the same layout; other boundaries or class widths another one."""
    from nsa.ops import varlen

    varlen._layout_of.cache_clear()
    first = varlen.layout(torch.tensor([0, 5, 12], dtype=torch.int32), None, 12, 1, torch.device("cpu"))
    assert varlen.layout(torch.tensor([0, 5, 12]), 12, 12, 1, torch.device("cpu")) is first
    assert varlen.layout(torch.tensor([0, 6, 12]), None, 12, 1, torch.device("cpu")) is not first
    assert varlen.layout(torch.tensor([0, 5, 12]), None, 12, 1, torch.device("cpu"), per_octave=1) is not first
    for end in range(13, 13 + varlen.LAYOUTS_KEPT):  # as many other packs as are kept push it out
        varlen.layout(torch.tensor([0, 5, end]), None, end, 1, torch.device("cpu"))
    assert varlen.layout(torch.tensor([0, 5, 12]), None, 12, 1, torch.device("cpu")) is not first
    with pytest.raises(ValueError, match="cu_seqlens must rise from 0"):  # a kept layout skips no check
        varlen.layout(torch.tensor([0, 5, 12]), None, 13, 1, torch.device("cpu"))


def test_packed_with_own_window_keys():
    inputs, cu = _packed_inputs([30, 41], torch.float64, "cpu")
    k_win, v_win = torch.randn_like(inputs[1]), torch.randn_like(inputs[2])
    o = nsa_attention(*inputs, CONFIG, kv_win=(k_win, v_win), cu_seqlens=cu, max_seqlen=48, backend="reference")
    o_1 = nsa_attention(*(x[:, 30:] for x in inputs), CONFIG, kv_win=(k_win[:, 30:], v_win[:, 30:]), backend="reference")
    torch.testing.assert_close(o[:, 30:], o_1, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(cu_seqlens=[1, 5, 12]), ValueError, "cu_seqlens must rise from 0"),
        (dict(cu_seqlens=[0, 7, 5, 12]), ValueError, "cu_seqlens must rise from 0"),
        (dict(cu_seqlens=[0, 5, 11]), ValueError, "packed length 12"),
        (dict(cu_seqlens=[0.0, 12.0]), TypeError, "cu_seqlens must be a 1-D int32/int64 tensor"),
        (dict(max_seqlen=6), ValueError, r"max_seqlen must be an int >= the longest sequence \(7\)"),
        (dict(q_offset=3), ValueError, "q_offset must be 0"),
        (dict(batch=2), ValueError, "packed as \\[1, total"),
        (dict(kv_cmp=True), ValueError, "kv_cmp cannot be combined with cu_seqlens"),
        (dict(no_cu=True, max_seqlen=7), ValueError, "max_seqlen is given without cu_seqlens"),
    ],
    ids=["not-from-0", "decreasing", "wrong-total", "float", "max-too-small", "q-offset", "batch-2", "kv-cmp", "no-cu"],
)
def test_packed_errors(change, error, match):
    inputs, _ = _packed_inputs([5, 7], torch.float64, "cpu")
    if change.get("batch") == 2:
        inputs = [torch.cat([x, x]) for x in inputs]
    kwargs = {"cu_seqlens": torch.tensor(change.get("cu_seqlens", [0, 5, 12]))}
    if change.get("no_cu"):
        kwargs.pop("cu_seqlens")
    if "max_seqlen" in change:
        kwargs["max_seqlen"] = change["max_seqlen"]
    if "q_offset" in change:
        kwargs["q_offset"] = change["q_offset"]
    if change.get("kv_cmp"):
        kwargs["kv_cmp"] = (inputs[1][:, :2], inputs[2][:, :2])
    with pytest.raises(error, match=match):
        nsa_attention(*inputs, CONFIG, backend="reference", **kwargs)
