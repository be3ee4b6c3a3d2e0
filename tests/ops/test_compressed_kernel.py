"""Triton compressed attention against the float64 reference: ``o``, ``lse`` and every gradient.

The loss weights both outputs (``o`` and the finite part of ``lse``) with random
cotangents, so the backward is checked through both. The fused entry point
:func:`nsa.ops.compressed.kernel.compressed_attention_select` must return the
same ``o``/``lse`` and the same blocks as the two separate ops.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from _kernel_inputs import spy_launches
from nsa import NSAConfig, routing
from nsa.ops import compressed_attention, select_blocks
from nsa.ops._triton.attention import EXACT_FLOAT32_TILES
from nsa.testing import assert_close

pytestmark = [pytest.mark.triton, pytest.mark.parity]

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4)


def _inputs(shape, config, q_offset, dtype, device, extra_tokens=0):
    B, T, HQ, H, DK, DV = shape
    nc = config.num_cmp(q_offset + T) + extra_tokens
    q = torch.randn(B, T, HQ, DK, device=device, dtype=dtype)
    k = torch.randn(B, nc, H, DK, device=device, dtype=dtype)
    v = torch.randn(B, nc, H, DV, device=device, dtype=dtype)
    return q, k, v


def _forward_backward(q, k, v, config, q_offset, backend, do, dlse):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o, lse = compressed_attention(q, k, v, config, q_offset=q_offset, backend=backend)
    finite = torch.isfinite(lse)
    loss = (o.double() * do).sum() + (torch.where(finite, lse, torch.zeros_like(lse)).double() * dlse).sum()
    loss.backward()
    return o, lse, q.grad, k.grad, v.grad


def check_against_reference(shape, config, q_offset, dtype, device, tol, extra_tokens=0):
    q, k, v = _inputs(shape, config, q_offset, dtype, device, extra_tokens)
    do = torch.randn(*q.shape[:3], v.shape[-1], device=device, dtype=torch.float64)
    dlse = torch.randn(q.shape[:3], device=device, dtype=torch.float64)
    out = _forward_backward(q, k, v, config, q_offset, "triton", do, dlse)
    ref = _forward_backward(q.double(), k.double(), v.double(), config, q_offset, "reference", do, dlse)
    o, lse = out[0], out[1]
    assert o.dtype == dtype and lse.dtype == torch.float32
    finite = torch.isfinite(ref[1])
    assert torch.equal(torch.isfinite(lse), finite), "lse must be -inf exactly where nothing is visible"
    assert (lse[~finite] == float("-inf")).all() and (o[~finite] == 0).all()
    assert_close("o", o, ref[0], tol(dtype, "fwd"))
    if finite.any():
        assert_close("lse", lse[finite], ref[1][finite], tol(dtype, "fwd"))
    for name, got, want in zip(("dq", "dk_cmp", "dv_cmp"), out[2:], ref[2:]):
        assert got.dtype == dtype
        assert_close(name, got, want, tol(dtype, "grad"))
    return q, k, v


CASES = [
    pytest.param((1, 77, 4, 1, 32, 32), SMALL, 0, id="B1-T77-HQ4-H1-D32"),
    pytest.param((2, 61, 2, 2, 16, 24), SMALL, 0, id="B2-T61-HQ2-H2-Dk16-Dv24-G1"),
    pytest.param((1, 45, 16, 1, 16, 16), SMALL, 0, id="B1-T45-HQ16-H1-D16-G16"),
    pytest.param((1, 39, 4, 1, 24, 16), SMALL, 50, id="B1-T39-HQ4-D24-offset50"),
    pytest.param((1, 50, 3, 1, 16, 16), NSAConfig(cmp_block=12, cmp_stride=4, sel_block=12, sel_count=5), 0,
                 id="B1-T50-HQ3-D16-l12-G3"),
]


@pytest.mark.parametrize("shape, config, q_offset", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compressed_matches_reference(shape, config, q_offset, dtype, nsa_device, nsa_tolerance):
    check_against_reference(shape, config, q_offset, dtype, nsa_device, nsa_tolerance)


def test_compressed_dk192_dv128(nsa_device, nsa_tolerance):
    """Dk = 192 (not a power of two) with Dv = 128, and a KV cache longer than the queries. Below
    Hopper's shared memory, float32 heads this wide take the reference (``nsa.routing``): skipped
    there with the router's reason."""
    ok, why = routing.triton_status("compressed", nsa_device, torch.float32, 192)
    if not ok:
        pytest.skip(why)
    check_against_reference((1, 37, 4, 2, 192, 128), SMALL, 0, torch.float32, nsa_device, nsa_tolerance,
                            extra_tokens=3)


def test_compressed_nothing_visible(nsa_device, nsa_tolerance):
    """T < cmp_block: every query sees nothing; o = 0, lse = -inf, gradients exactly 0."""
    config = NSAConfig(cmp_block=32, cmp_stride=16, sel_block=64, sel_count=4)
    q, k, v = _inputs((1, 20, 4, 1, 16, 16), config, 0, torch.float32, nsa_device, extra_tokens=2)
    do = torch.randn(*q.shape[:3], 16, device=nsa_device, dtype=torch.float64)
    o, lse, dq, dk, dv = _forward_backward(q, k, v, config, 0, "triton", do, torch.zeros(q.shape[:3], device=nsa_device))
    assert (o == 0).all() and (lse == float("-inf")).all()
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


def test_fused_select_matches_separate_ops(nsa_device):
    """One launch gives the same o/lse as compressed_attention and the same blocks as select_blocks."""
    from nsa.ops.compressed.kernel import compressed_attention_select

    config = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=3, local_blocks=1)
    q, k, v = _inputs((1, 70, 8, 2, 16, 24), config, 5, torch.float32, nsa_device)
    scale = config.softmax_scale(16)
    o, lse, idx = compressed_attention_select(q, k, v, config, scale, 5)
    o_ref, lse_ref = compressed_attention(q, k, v, config, q_offset=5, backend="triton")
    idx_ref = select_blocks(q.double(), k.double(), config, q_offset=5, backend="reference")
    assert_close("o", o, o_ref, 1e-6)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse_ref))
    assert torch.equal(idx.long(), idx_ref.long())
    assert torch.equal(idx, select_blocks(q, k, config, q_offset=5, backend="triton"))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float16, 2e-3)])
def test_dkdv_tiles_of_their_own(dtype, tol, nsa_device, monkeypatch):
    """dK/dV launched with other tiles than dq (the ``dkdv`` override, and for 16-bit inputs the
    default ``DKDV_TILES``: 128-token tiles split over up to 32 programs) give the same gradients."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import kernel

    token_tiles = spy_launches(monkeypatch, kernel, "compressed_bwd_dkdv_kernel", "BN")  # of every dK/dV launch
    q, k, v = _inputs((1, 301, 8, 2, 16, 24), SMALL, 3, dtype, nsa_device)
    scale = SMALL.softmax_scale(16)
    o, lse, _ = compressed_fwd(q, k, v, SMALL, scale, 3)
    do = torch.randn_like(o)
    base = kernel.compressed_bwd(q, k, v, o, lse, do, None, SMALL, scale, 3)
    other = kernel.compressed_bwd(q, k, v, o, lse, do, None, SMALL, scale, 3, dkdv=(16, 16, 4, 2), max_splits=1)
    # 16-bit inputs take DKDV_TILES (on the CPU too, so that CI runs the GPU's launch); float32 (exact at torch's
    # default precision) the dq tiles, its own
    assert token_tiles == [kernel.DKDV_TILES["tiles"][1] if dtype != torch.float32 else EXACT_FLOAT32_TILES["BN"], 16]
    assert torch.equal(base[0], other[0])  # dq's launch is unchanged
    for name, a, b in zip(("dk", "dv"), base[1:], other[1:]):
        assert_close(name, b, a, tol)


def test_dkdv_over_query_chunks(nsa_device, monkeypatch):
    """The dK/dV programs of a token tile take fixed chunks of the whole query range, walked from
    the chunk's end down, so most token tiles begin inside a chunk and skip the chunks before
    (which add zeros): any number of chunks (2, 13) gives one chunk's gradients, up to
    rounding, and the reference's."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import kernel

    monkeypatch.setitem(kernel.DKDV_TILES, "split_target", 10**6)  # the cap alone sets the chunks
    q, k, v = _inputs((1, 301, 8, 2, 16, 24), SMALL, 3, torch.float32, nsa_device)
    scale = SMALL.softmax_scale(16)
    o, lse, _ = compressed_fwd(q, k, v, SMALL, scale, 3)
    do = torch.randn_like(o)
    one = kernel.compressed_bwd(q, k, v, o, lse, do, None, SMALL, scale, 3, dkdv=(16, 16, 4, 2), max_splits=1)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    o_ref, _ = compressed_attention(qd, kd, vd, SMALL, q_offset=3, backend="reference")
    o_ref.backward(do.double())
    for splits in (2, 13):
        many = kernel.compressed_bwd(q, k, v, o, lse, do, None, SMALL, scale, 3, dkdv=(16, 16, 4, 2),
                                     max_splits=splits)
        for name, a, b, want in zip(("dk", "dv"), one[1:], many[1:], (kd.grad, vd.grad)):
            assert_close(f"{name} in {splits} chunks", b, a, 1e-6)
            assert_close(f"{name} in {splits} chunks against the reference", b, want, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape", [(1, 4096, 64, 4, 128, 128), (2, 3001, 16, 1, 192, 128), (1, 2053, 16, 16, 64, 64)],
    ids=["T4096-HQ64-H4-D128", "B2-T3001-G16-Dk192-Dv128", "T2053-G1-D64"],
)
def test_compressed_gpu_bf16(shape, nsa_device, nsa_tolerance):
    check_against_reference(shape, NSAConfig(), 0, torch.bfloat16, nsa_device, nsa_tolerance)


def test_compressed_backward_takes_delta_or_dlse_not_both(nsa_device):
    """A ``delta`` from the caller replaces the kernel's ``rowsum(o * do)``: the same gradients
    (``o`` is then not read, so it may be anything); with an lse gradient too, the call is refused."""
    from nsa.ops._triton.attention import attn_bwd_delta
    from nsa.ops.compressed.kernel import compressed_bwd
    from nsa.ops._triton.compressed_fwd import compressed_fwd

    B, T, HQ, H, D = 1, 45, 4, 2, 16
    q = torch.randn(B, T, HQ, D, device=nsa_device)
    k, v = (torch.randn(B, SMALL.num_cmp(T), H, D, device=nsa_device) for _ in range(2))
    scale = SMALL.softmax_scale(D)
    o, lse, _ = compressed_fwd(q, k, v, SMALL, scale, 0)
    do = torch.randn_like(o)
    want = compressed_bwd(q, k, v, o, lse, do, None, SMALL, scale, 0)
    got = compressed_bwd(q, k, v, torch.full_like(o, float("nan")), lse, do, None, SMALL, scale, 0,
                         delta=attn_bwd_delta(o, do))
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert_close(name, a, b, 1e-6)
    with pytest.raises(ValueError, match="delta or dlse"):
        compressed_bwd(q, k, v, o, lse, do, torch.zeros_like(lse), SMALL, scale, 0, delta=attn_bwd_delta(o, do))


@pytest.mark.parametrize(
    "dtype, B, q_offset, gated, tiles",
    [
        (torch.float32, 2, 5, True, {}),
        (torch.float16, 1, 0, False, {}),
        (torch.float32, 1, 3, False, dict(dkdv=(16, 32, 4, 2), dq_ds=(16, 4, 2), max_splits=3)),
        (torch.float32, 2, 5, True, dict(dkdv=(16, 16, 4, 2), dq_ds=(16, 4, 2, 2))),
        (torch.float16, 1, 3, False, dict(dkdv=(16, 16, 4, 2), dq_ds=(16, 4, 2, 4))),
    ],
    ids=["fp32-B2-off5-gated", "fp16-default-tiles", "fp32-tiles-of-16-and-32-chunks", "fp32-2-query-tiles-a-dq",
         "fp16-4-query-tiles-a-dq"],
)
def test_dq_from_the_dkdv_kernels_ds(dtype, B, q_offset, gated, tiles, nsa_device, monkeypatch):
    """Given ``delta`` (as training gives it), the dK/dV kernel runs first and leaves every (query
    tile, token tile) pair's ``dS`` in a staircase buffer, from which the dQ takes one product a
    tile: the same gradients as with ``NSA_COMPRESSED_DQ_FROM_DS_MIB=0`` up to rounding, with gates,
    ``q_offset``, a batch, query chunks, token tiles of the dQ narrower than the dK/dV's, and dQ
    programs of several query tiles (83 positions in tiles of 4: a last program of fewer tiles; with
    16-token tiles a program's query tiles own staircase rows of different widths).
    ``torch.empty`` is NaN-filled in tests: a row of the staircase that the dK/dV kernel did not
    write would reach ``dq``."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import kernel

    launches = spy_launches(monkeypatch, kernel, "compressed_bwd_dq_ds_kernel", "BN", "QT")  # the dQ-from-dS launches
    q, k, v = _inputs((B, 83, 8, 2, 16, 24), SMALL, q_offset, dtype, nsa_device)
    scale = SMALL.softmax_scale(16)
    o, lse, _ = compressed_fwd(q, k, v, SMALL, scale, q_offset)
    do = torch.randn_like(o)
    gate = torch.rand(*o.shape[:3], device=nsa_device) if gated else None
    delta = (o.float() * do.float()).sum(-1)
    out = {}
    for mib in ("4096", "0"):
        monkeypatch.setenv("NSA_COMPRESSED_DQ_FROM_DS_MIB", mib)
        out[mib] = kernel.compressed_bwd(q, k, v, o, lse, do, None, SMALL, scale, q_offset, delta=delta, gate=gate,
                                         **tiles)
    # the first call alone; by default the dK/dV's token tile where that is narrower (exact float32's), and
    # 16-bit inputs take the tiles tuned on Hopper (the interpreter counts as a Hopper-sized GPU)
    own = kernel.DQ_DS_TILES if dtype == torch.float32 else kernel.DQ_DS_HOPPER_TILES
    default = (min(own["block_n"], EXACT_FLOAT32_TILES["BN"] if dtype == torch.float32 else 128), own["query_tiles"])
    given = tiles.get("dq_ds")
    assert launches == [(given[0], given[3] if len(given) == 4 else 1) if given else default]
    tol = 1e-5 if dtype == torch.float32 else 1e-3
    for name, got, want in zip(("dq", "dk", "dv"), out["4096"], out["0"]):
        assert torch.isfinite(got).all()
        assert_close(name, got, want, tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dq_ds", [(64, 8, 3, 2), (64, 8, 3, 4), (64, 4, 3, 2)], ids=lambda t: "-".join(map(str, t)))
def test_dq_ds_over_several_query_tiles_real_size(dq_ds, nsa_device, monkeypatch):
    """At a real size (bf16, 64 query heads, 4 KV heads, the paper's geometry, 6k tokens, the GPU's
    dK/dV tiles) the dQ programs of several query tiles give the one-tile programs' dq within bf16
    rounding, with every row finite (``torch.empty`` NaN-filled)."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import kernel

    config, T = NSAConfig(), 6000 + 11
    q = torch.randn(1, T, 64, 128, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, config.num_cmp(T), 4, 128, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    scale = config.softmax_scale(128)
    o, lse, _ = compressed_fwd(q, k, v, config, scale, 0)
    do = torch.randn_like(o)
    gate = torch.rand(*o.shape[:3], device=nsa_device)
    delta = (o.float() * do.float()).sum(-1)
    monkeypatch.setenv("NSA_COMPRESSED_DQ_FROM_DS_MIB", "4096")
    run = lambda tiles: kernel.compressed_bwd(q, k, v, o, lse, do, None, config, scale, 0, delta=delta, gate=gate,
                                              dq_ds=tiles)
    want, got = run((64, 4, 3, 1)), run(dq_ds)
    assert torch.isfinite(got[0]).all()
    assert_close("dq", got[0], want[0], 1e-3)
    for name, a, b in zip(("dk", "dv"), got[1:], want[1:]):
        assert torch.equal(a, b), name


def test_ds_layout_and_budget(nsa_device, monkeypatch):
    """The staircase gives query tile ``i`` the whole token tiles that it sees, from the sum of the
    earlier tiles' widths on; the buffer is made only within ``NSA_COMPRESSED_DQ_FROM_DS_MIB``, and a
    dQ token tile that does not divide the dK/dV's is refused."""
    from nsa.ops.compressed import kernel

    offsets, total = kernel.ds_layout(83, 19, 5, 4, 8, 8, 4, nsa_device)
    last = [min(4 * i + 4, 83) - 1 + 5 for i in range(21)]  # each tile's last position
    seen = [min(max((t + 1 - 8) // 4 + 1, 0), 19) if t + 1 >= 8 else 0 for t in last]
    widths = [-(-n // 8) * 8 for n in seen]
    assert offsets.tolist() == [sum(widths[:i]) for i in range(21)] and total == sum(widths)

    T, NC = 600, SMALL.num_cmp(600)
    q = torch.empty(1, T, 8, 16, device=nsa_device)
    k_cmp = torch.empty(1, NC, 2, 16, device=nsa_device)
    kv = dict(BT=4, GP=4, BN=8)
    _, total = kernel.ds_layout(T, NC, 0, 4, 8, SMALL.cmp_block, SMALL.cmp_stride, nsa_device)
    size = 2 * total * 16 * 4  # 2 KV heads x rows x 16 values x 4 bytes
    assert 2**20 < size < 2 * 2**20
    for mib in ("0", "1"):
        monkeypatch.setenv("NSA_COMPRESSED_DQ_FROM_DS_MIB", mib)
        assert kernel._ds_buffer(q, k_cmp, SMALL, 0, kv, (8, 4, 2)) is None
    monkeypatch.setenv("NSA_COMPRESSED_DQ_FROM_DS_MIB", "2")
    ds = kernel._ds_buffer(q, k_cmp, SMALL, 0, kv, (8, 4, 2))
    assert ds["buffer"].numel() * 4 == size and ds["total"] == total
    with pytest.raises(ValueError, match="must divide"):
        kernel._ds_buffer(q, k_cmp, SMALL, 0, kv, (16, 4, 2))


@pytest.mark.parametrize("blocks_per_step", [None, 16, 32, 64])
def test_score_steps_stay_within_their_tokens(blocks_per_step):
    """A pass-2 step scores at most ``SCORE_STEP_TOKENS`` compressed tokens whatever the geometry (and
    at least the 16 a ``tl.dot`` needs): 32 blocks of 8 tokens (``sel_block / cmp_stride``) took 289
    KiB of shared memory for 192-wide heads on an H200 (the fuzzer, session 79). The paper's geometry
    keeps its measured 32 blocks a step."""
    from nsa.ops._triton.compressed_fwd import SCORE_STEP_TOKENS, _score_geometry

    for stride, sel_block in ((16, 64), (8, 64), (4, 32), (4, 64), (2, 64), (1, 128), (4, 4), (6, 18), (16, 512)):
        geo = _score_geometry(NSAConfig(cmp_block=stride, cmp_stride=stride, sel_block=sel_block), blocks_per_step)
        tokens = geo["NB"] * geo["RP"]
        assert 16 <= tokens <= max(SCORE_STEP_TOKENS, geo["RP"]), (stride, sel_block, geo)
    assert _score_geometry(NSAConfig())["NB"] == 32
