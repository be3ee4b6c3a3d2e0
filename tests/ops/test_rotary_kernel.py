"""The rotary embedding's Triton kernel against its float64 reference: output and the gradient of
``x``, for tables shared by the batch (``[T, 1, D/2]``) and per sequence (``[B, T, 1, D/2]``),
halves that are not a power of two, head counts that do not fill a program, and inputs whose rows
are strided; the tables' kernel against theirs, bit for bit. On CPU through Triton's interpreter;
the ``gpu`` cases at a layer's real size."""

from __future__ import annotations

import pytest
import torch

from nsa.modules.rotary import RotaryEmbedding
from nsa.ops import apply_rotary, rope_tables
from nsa.testing import assert_close

pytestmark = [pytest.mark.triton, pytest.mark.parity]


def _tables(B, T, D, per_sequence, dtype, device):
    """``(cos, sin)`` of random positions and frequencies (fresh angles, not a layer's)."""
    positions = torch.randint(0, 70000, (B, T) if per_sequence else (T,), device=device, dtype=torch.float64)
    angles = positions[..., None] * torch.rand(D // 2, device=device, dtype=torch.float64)
    return angles.cos().to(dtype).unsqueeze(-2), angles.sin().to(dtype).unsqueeze(-2)


def _check(B, T, heads, D, per_sequence, dtype, device, tol, strided=False):
    x = torch.randn(B, T, heads + 2 * strided, D, device=device, dtype=dtype)
    x = x[:, :, 1 : 1 + heads] if strided else x  # rows two heads apart
    cos, sin = _tables(B, T, D, per_sequence, dtype, device)
    dy = torch.randn(B, T, heads, D, device=device, dtype=torch.float64)
    leaf = x.detach().requires_grad_()
    y = apply_rotary(leaf, cos, sin, backend="triton")
    assert y.dtype == dtype and y.shape == x.shape
    (dx,) = torch.autograd.grad(y, leaf, dy.to(dtype))
    ref_leaf = x.detach().double().requires_grad_()
    ref = apply_rotary(ref_leaf, cos.double(), sin.double(), backend="reference")
    (ref_dx,) = torch.autograd.grad(ref, ref_leaf, dy)
    assert_close("y", y, ref, tol(dtype, "fwd"))
    assert_close("dx", dx, ref_dx, tol(dtype, "grad"))


@pytest.mark.parametrize(
    "B, T, heads, D, per_sequence, strided",
    [
        pytest.param(2, 37, 3, 12, False, False, id="shared-table-half6-heads3"),
        pytest.param(2, 19, 5, 16, True, False, id="per-sequence-table"),
        pytest.param(1, 23, 4, 32, False, True, id="strided-rows"),
        # 40 heads of 256: two programs a position (32 heads each, the second part-filled)
        pytest.param(1, 5, 40, 256, False, False, id="heads-over-two-programs"),
    ],
)
def test_rotary_triton_matches_reference(B, T, heads, D, per_sequence, strided, nsa_device, nsa_tolerance):
    _check(B, T, heads, D, per_sequence, torch.float32, nsa_device, nsa_tolerance, strided)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_rotary_triton_real_size(heads, dtype, nsa_device, nsa_tolerance):
    """A layer's queries (64 heads) and keys (4), 4096 positions, head dim 128."""
    _check(1, 4096, heads, 128, False, dtype, nsa_device, nsa_tolerance)


def test_rotary_names_a_bad_argument():
    x = torch.randn(1, 5, 2, 8)
    cos = torch.randn(5, 1, 4)
    with pytest.raises(ValueError, match=r"even last dimension"):
        apply_rotary(torch.randn(1, 5, 2, 7), cos, cos)
    with pytest.raises(ValueError, match=r"sin must have shape \[\(B,\) T, 1, D/2\] = \[5, 1, 4\], got \[5, 2, 4\]"):
        apply_rotary(x, cos, cos.expand(5, 2, 4))
    with pytest.raises(TypeError, match=r"cos has dtype torch.float64 but x has torch.float32"):
        apply_rotary(x, cos.double(), cos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(
    "shape, D", [((37,), 12), ((3, 20), 128), ((1, 1), 6)], ids=["shared-half6", "per-sequence-half64", "one-half3"]
)
def test_rope_tables_triton_equal_reference(shape, D, dtype, nsa_device):
    """The tables' one launch gives the reference's tables bit for bit on the GPU: cosines and
    sines of float64 angles, rounded to the dtype through float32 as PyTorch rounds them;
    positions up to about a million (angles of many turns), a layer's frequencies. Triton's
    interpreter rounds float32 to 16 bits its own way (not always to nearest), so on CPU 16-bit
    tables may differ by one unit in the last place, no more."""
    positions = torch.randint(0, 1_000_003, shape, device=nsa_device)
    inv_freq = RotaryEmbedding(D).inv_freq(nsa_device)
    got = rope_tables(positions, inv_freq, dtype, backend="triton")
    want = rope_tables(positions, inv_freq, dtype, backend="reference")
    for name, g, w in zip(("cos", "sin"), got, want):
        assert g.shape == (*shape, 1, D // 2) and g.dtype == dtype, name
        if nsa_device.type == "cuda" or dtype == torch.float32:
            assert torch.equal(g, w), f"{name}: {(g != w).sum()} of {g.numel()} differ"
        else:
            ulp = torch.finfo(dtype).eps * w.float().abs().clamp_min(torch.finfo(dtype).tiny)  # at most 2x the spacing
            assert ((g.float() - w.float()).abs() <= ulp).all(), name


def test_rope_tables_name_a_bad_argument():
    inv_freq = RotaryEmbedding(8).inv_freq(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"positions must be a \[T\] or \[B, T\] tensor"):
        rope_tables(torch.zeros(1, 2, 3, dtype=torch.int64), inv_freq, torch.float32)
    with pytest.raises(TypeError, match="positions must be int32/int64, got torch.float32"):
        rope_tables(torch.zeros(4), inv_freq, torch.float32)
    with pytest.raises(TypeError, match="inv_freq must be float64, got torch.float32"):
        rope_tables(torch.zeros(4, dtype=torch.int64), inv_freq.float(), torch.float32)
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype, got torch.int32"):
        rope_tables(torch.zeros(4, dtype=torch.int64), inv_freq, torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rotation_at_lengths_equals_the_tables_then_the_rotation(dtype, nsa_device):
    """A decode step's rotation in one launch (``rotate_at_lengths``): positions ``lengths + t``
    written out, and the rotated heads bit for bit those of ``rope_tables`` at those positions and
    ``rotary`` (both Triton), for sequences at different lengths (one past 2**16), strided rows
    (views of a wider product) and heads over two programs."""
    from nsa.modules.rotary import RotaryEmbedding
    from nsa.ops.rotary.kernel import rotate_at_lengths

    torch.manual_seed(3)
    B, T, heads, D = 3, 2, 70, 64
    product = torch.randn(B, T, heads * D + 40, device=nsa_device, dtype=dtype)
    x = product[..., : heads * D].unflatten(-1, (heads, D))
    lengths = torch.tensor([0, 17, 70001], device=nsa_device, dtype=torch.int32)
    inv_freq = RotaryEmbedding(D).inv_freq(nsa_device)
    positions = torch.full((B, T), -1, device=nsa_device, dtype=torch.int64)  # poisoned
    got = rotate_at_lengths(x, lengths, inv_freq, positions)
    want_positions = lengths[:, None].long() + torch.arange(T, device=nsa_device)
    assert torch.equal(positions, want_positions)
    tables = rope_tables(want_positions, inv_freq, dtype, backend="triton")
    assert torch.equal(got, apply_rotary(x, *tables, backend="triton"))


def test_rotation_at_lengths_names_a_bad_argument():
    from nsa.ops.rotary.kernel import rotate_at_lengths

    x, lengths, inv_freq = torch.randn(2, 1, 3, 8), torch.zeros(2, dtype=torch.int32), torch.ones(4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"positions must be a contiguous int64 \[B, T\] = \[2, 1\] tensor, got torch.int32"):
        rotate_at_lengths(x, lengths, inv_freq, torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"lengths must be int32 \[B\] = \[2\], got torch.int64"):
        rotate_at_lengths(x, lengths.long(), inv_freq, torch.zeros(2, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"inv_freq must be float64 \[D/2\] = \[4\], got torch.float32"):
        rotate_at_lengths(x, lengths, inv_freq.float(), torch.zeros(2, 1, dtype=torch.int64))


def test_decode_step_rotates_at_the_lengths_in_one_launch(monkeypatch, nsa_device):
    """Where RoPE runs on Triton a layer's device step rotates at the cache's lengths in one launch
    (``rotate_at_lengths``) and takes its positions from it: two steps of two sequences of
    different lengths give outputs, selections and caches bit for bit those of the step that
    computes the positions, the tables and the rotation apart (float32, the interpreter)."""
    if nsa_device.type == "cuda":
        pytest.skip("float32 layers on the CPU, through the interpreter; the GPU's steps are test_decode_graph's")
    import nsa.ops.rotary.kernel as rotary_kernel
    from nsa import NSAAttention, NSAConfig

    monkeypatch.setenv("NSA_BACKEND_ROTARY", "triton")
    calls = []
    real = rotary_kernel.rotate_at_lengths
    monkeypatch.setattr(rotary_kernel, "rotate_at_lengths", lambda *a: (calls.append(1), real(*a))[1])
    config = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=3, window=8)
    results = {}
    for fused in (True, False):
        monkeypatch.setattr(NSAAttention, "_rotation_on_triton", lambda self, x: fused)
        torch.manual_seed(1)
        layer = NSAAttention(32, 4, 2, 8, config=config, backend="triton")
        cache = layer.new_cache(2, capacity=40, static=True)
        with torch.no_grad():
            layer(torch.randn(2, 20, 32), cache)  # a prefill (past DEVICE_STEP_MAX_TOKENS)
            cache.seq_lens.sub_(torch.tensor([0, 5], dtype=torch.int32))  # rows at different lengths
            steps = [layer(torch.randn(2, 2, 32), cache) for _ in range(2)]
        results[fused] = (steps, cache.last_block_idx, {n: cache.buffer(n) for n in cache._buf}, cache.seq_lens)
    assert len(calls) == 2
    (steps, idx, bufs, lens), (want_steps, want_idx, want_bufs, want_lens) = results[True], results[False]
    assert all(torch.equal(a, b) for a, b in zip(steps, want_steps)) and torch.equal(idx, want_idx)
    assert all(torch.equal(bufs[n], want_bufs[n]) for n in bufs) and torch.equal(lens, want_lens)
