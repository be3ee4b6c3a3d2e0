"""Triton selected-block attention against the float64 reference: ``o`` and every gradient.

``block_idx`` is random on purpose: any order, repeats and -1 entries, blocks past
the query (all of which the op must skip), so the kernel's own de-duplication and
causal masking are exercised, besides the ascending unique lists ``select_blocks``
makes. On CPU the kernels run through Triton's interpreter at small, odd sizes
(float32 and float16: Triton 3.9's interpreter computes bfloat16 ``tl.dot``
wrongly); the ``gpu`` cases run real sizes in bfloat16 against a float32 reference.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from nsa import NSAConfig
from nsa.ops import selected_attention
from nsa.ops.selected.kernel import BWD_TILES, FWD_TILES, _forced_launch, _warps, selected_bwd, selected_fwd
from nsa.testing import assert_close

from _kernel_inputs import assert_bitwise_repeatable, every_launch, gpu_shapes, qkv

pytestmark = [pytest.mark.triton, pytest.mark.parity]


def _config(sel_block: int, count: int, init: int = 1, local: int = 1) -> NSAConfig:
    """Forced blocks (init, local) go through the tile-shared kernels; (0, 0) skips them."""
    return NSAConfig(cmp_block=sel_block, cmp_stride=sel_block // 2, sel_block=sel_block, sel_count=count,
                     init_blocks=init, local_blocks=local)


def random_blocks(B, T, H, count, num_blocks, device):
    """int32 ``[B, T, H, count]`` in [-1, num_blocks): unordered, with repeats, -1 and future blocks.

    Entry 0 is forced to block 0 so that every query sees at least its first key."""
    idx = torch.randint(-1, num_blocks, (B, T, H, count), device=device, dtype=torch.int32)
    idx[..., 0] = 0
    return idx


def _forward_backward(q, k, v, block_idx, config, q_offset, backend, do):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = selected_attention(q, k, v, block_idx, config, q_offset=q_offset, backend=backend)
    (o.double() * do).sum().backward()
    return o, q.grad, k.grad, v.grad


def check_against_reference(q, k, v, block_idx, config, q_offset, tol, ref_dtype=torch.float64):
    """Kernel in q's dtype vs the reference in ``ref_dtype``: forward, dq, dk, dv."""
    do = torch.randn(*q.shape[:3], v.shape[-1], device=q.device, dtype=torch.float64)
    out = _forward_backward(q, k, v, block_idx, config, q_offset, "triton", do)
    ref = _forward_backward(q.to(ref_dtype), k.to(ref_dtype), v.to(ref_dtype), block_idx, config, q_offset, "reference", do)
    assert out[0].dtype == q.dtype
    for name, got, want in zip(("o", "dq", "dk", "dv"), out, ref):
        assert got.shape == want.shape
        assert_close(name, got, want, tol(q.dtype, "fwd" if name == "o" else "grad"))


F32, F16 = torch.float32, torch.float16
CASES = [
    # (B, T, HQ, H, DK, DV, sel_block, count, (init, local), q_offset, TK, dtype)
    pytest.param(1, 41, 4, 1, 32, 32, 16, 3, (1, 1), 0, 41, F32, id="B1-T41-HQ4-H1-D32-bs16-n3-fp32"),
    pytest.param(1, 41, 4, 1, 32, 32, 16, 3, (1, 1), 0, 41, F16, id="B1-T41-HQ4-H1-D32-bs16-n3-fp16"),
    pytest.param(2, 15, 2, 2, 16, 32, 8, 3, (0, 0), 0, 15, F32, id="B2-T15-HQ2-H2-DK16-DV32-bs8-n3-noforced-fp32"),
    pytest.param(1, 19, 16, 1, 16, 16, 16, 3, (1, 2), 0, 19, F16, id="B1-T19-HQ16-H1-D16-bs16-n3-fp16"),
    pytest.param(1, 17, 6, 2, 48, 24, 8, 3, (2, 1), 13, 45, F32, id="B1-T17-HQ6-H2-DK48-DV24-init2-off13-TK45-fp32"),
]


@pytest.mark.parametrize("B, T, HQ, H, DK, DV, sel_block, count, forced, q_offset, TK, dtype", CASES)
def test_selected_matches_reference(B, T, HQ, H, DK, DV, sel_block, count, forced, q_offset, TK, dtype, nsa_device, nsa_tolerance):
    config = _config(sel_block, count, *forced)
    q, k, v = qkv(B, T, HQ, H, DK, DV, dtype, nsa_device, TK)
    block_idx = random_blocks(B, T, H, count, config.num_sel_blocks(TK), nsa_device)
    check_against_reference(q, k, v, block_idx, config, q_offset, nsa_tolerance)


def test_selected_dk192_dv128(nsa_device, nsa_tolerance):
    config = _config(16, 2)
    q, k, v = qkv(1, 21, 4, 1, 192, 128, torch.float16, nsa_device)
    check_against_reference(q, k, v, random_blocks(1, 21, 1, 2, 2, nsa_device), config, 0, nsa_tolerance)


def test_selected_ascending_int64_from_select_blocks_layout(nsa_device, nsa_tolerance):
    """The layout ``select_blocks`` returns: ascending unique blocks padded with -1, int64 here."""
    config = _config(8, 3)
    T = 29
    rows = [sorted({0, max(t // 8 - 1, 0), t // 8}) for t in range(T)]  # init + two local blocks
    rows = [r + [-1] * (3 - len(r)) for r in rows]
    block_idx = torch.tensor(rows, device=nsa_device)[None, :, None, :].expand(1, T, 2, 3).contiguous()
    q, k, v = qkv(1, T, 4, 2, 16, 16, torch.float32, nsa_device)
    check_against_reference(q, k, v, block_idx, config, 0, nsa_tolerance)


def test_selected_rows_with_nothing_selected(nsa_device):
    """All entries -1 (or all in the future): o = 0 and zero gradients, never NaN."""
    config = _config(8, 2)
    q, k, v = (x.requires_grad_() for x in qkv(1, 13, 2, 1, 16, 16, torch.float32, nsa_device))
    block_idx = torch.full((1, 13, 1, 2), -1, device=nsa_device, dtype=torch.int32)
    block_idx[:, :8, :, 1] = 1  # block 1 starts at position 8: in the future for t < 8
    o = selected_attention(q, k, v, block_idx, config, backend="triton")
    o.sum().backward()
    assert (o == 0).all()
    for g in (q.grad, k.grad, v.grad):
        assert (g == 0).all()


@pytest.mark.parametrize("qseg", [2, 5], ids=["qseg2", "qseg5"])
def test_selected_dkdv_split_over_segments(qseg, nsa_device, nsa_tolerance):
    """A block chosen by more queries than one dK/dV program takes: partial sums reduced in order."""
    config = _config(8, 3)
    B, T, HQ, H = 1, 27, 4, 2
    q, k, v = qkv(B, T, HQ, H, 16, 16, torch.float32, nsa_device)
    block_idx = random_blocks(B, T, H, 3, config.num_sel_blocks(T), nsa_device)
    o, lse = selected_fwd(q, k, v, block_idx, 8, 0.25, 0)
    do = torch.randn_like(o)
    got = selected_bwd(q, k, v, block_idx, o, lse, do, 8, 0.25, 0, tiles={"dkdv": dict(QSEG=qseg, BQ=1)})
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    ref_o = selected_attention(qd, kd, vd, block_idx, dataclasses.replace(config, scale=0.25), backend="reference")
    ref_o.backward(do.double())
    for name, g, want in zip(("dq", "dk", "dv"), got, (qd.grad, kd.grad, vd.grad)):
        assert_close(name, g, want, nsa_tolerance(torch.float32, "grad"))


@pytest.mark.parametrize("bq", [2, 4, 8])
@pytest.mark.parametrize("forced, q_offset", [((1, 1), 0), ((0, 0), 5)], ids=["forced", "noforced-off5"])
def test_selected_tiles_of_several_queries(bq, forced, q_offset, nsa_device, nsa_tolerance, monkeypatch):
    """``BQ`` query positions a forward/dQ program (T not a multiple of it), set through the
    ``NSA_SELECTED_TILE_QUERIES`` flag: each block that any of them holds is loaded once and
    counts only for the rows of the queries that hold it (random lists: repeats, -1, future
    blocks and blocks shared by neighbours)."""
    monkeypatch.setenv("NSA_SELECTED_TILE_QUERIES", str(bq))
    sel, count = 8, 4
    config = dataclasses.replace(_config(sel, count, *forced), scale=0.25)
    B, T, HQ, H, TK = 2, 23, 4, 2, 23 + q_offset
    q, k, v = qkv(B, T, HQ, H, 16, 16, torch.float32, nsa_device, TK)
    block_idx = random_blocks(B, T, H, count, config.num_sel_blocks(TK), nsa_device)
    block_idx[:, 1::2, :, 1] = block_idx[:, 0:-1:2, :, 1]  # neighbours share a block
    o, lse = selected_fwd(q, k, v, block_idx, sel, 0.25, q_offset, forced=forced)
    do = torch.randn_like(o)
    got = selected_bwd(q, k, v, block_idx, o, lse, do, sel, 0.25, q_offset, forced=forced)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    ref_o = selected_attention(qd, kd, vd, block_idx, config, q_offset=q_offset, backend="reference")
    ref_o.backward(do.double())
    assert_close("o", o, ref_o, nsa_tolerance(torch.float32, "fwd"))
    for name, g, want in zip(("dq", "dk", "dv"), got, (qd.grad, kd.grad, vd.grad)):
        assert_close(name, g, want, nsa_tolerance(torch.float32, "grad"))


def test_selected_tile_size_is_checked(nsa_device, monkeypatch):
    q, k, v = qkv(1, 8, 2, 1, 16, 16, torch.float32, nsa_device)
    block_idx = random_blocks(1, 8, 1, 2, 1, nsa_device)
    with pytest.raises(ValueError, match=r"BQ .* got 3"):
        selected_fwd(q, k, v, block_idx, 8, 0.25, 0, tiles=dict(BQ=3))
    monkeypatch.setenv("NSA_SELECTED_TILE_QUERIES", "16")
    with pytest.raises(ValueError, match=r"NSA_SELECTED_TILE_QUERIES=16 \(from environment\) is not allowed; "
                                         "choose one of 1, 2, 4, 8"):
        selected_fwd(q, k, v, block_idx, 8, 0.25, 0)


def test_inversion_lists_the_queries_of_each_block(nsa_device):
    """Every (batch, KV head, block) list holds exactly the queries that chose the block, each
    once, ascending (descending lists, so that the programs running together would walk the
    queries in step, read more from DRAM and took longer at 64k: docs/perf/prefill.md, session 12).
    With ``skip_local=2`` each query's two local blocks (its own and the one before), whose share
    the window's dK/dV kernel takes, are left out."""
    from nsa.ops.selected.kernel import invert_selection

    B, T, H, N, NB, sel = 2, 45, 3, 4, 6, 8
    block_idx = random_blocks(B, T, H, N, NB, nsa_device)
    block_idx[0, 30, 1, 2] = block_idx[0, 30, 1, 1]  # a repeat counts once
    for skip_local in (0, 2):
        inv = invert_selection(block_idx, sel, 0, NB, 3, skip_local=skip_local)
        t_sorted = inv["t_sorted"].tolist()
        for b in range(B):
            for h in range(H):
                for j in range(NB):
                    owner = (b * H + h) * NB + j
                    start, count = int(inv["starts"][owner]), int(inv["counts"][owner])
                    want = sorted({t for t in range(T) if j <= t // sel - skip_local and j in block_idx[b, t, h].tolist()})
                    assert t_sorted[start : start + count] == want, (skip_local, b, h, j)


@pytest.mark.parametrize("forced, bq", [((1, 2), 1), ((0, 0), 1), ((0, 0), 4)],
                         ids=["forced", "noforced", "noforced-4-queries"])
def test_selected_block_copies_equal_plain_loads(forced, bq, nsa_device):
    """The forward and dQ fetching each block by one bulk copy through tensor descriptors
    (``KV_DESC``: the forward's default where copies run, the CPU included) give bitwise the
    plain loads' results, also over a cache whose unwritten tail holds NaN: the keys that the
    mask drops must not reach ``P V`` or ``dS K`` as ``0 * NaN``."""
    from nsa.ops._triton.attention import attn_bwd_delta
    from nsa.ops._triton.device import bulk_copies_supported
    from nsa.ops.selected.kernel import selected_bwd_dq

    if not bulk_copies_supported(nsa_device):
        pytest.skip("tensor-descriptor copies need Hopper or later")
    T, sel = 61, 16
    q, k, v = qkv(1, T, 4, 2, 16, 16, torch.float32, nsa_device, TK=T + 9)
    k[:, T:], v[:, T:] = float("nan"), float("nan")
    block_idx = random_blocks(1, T, 2, 5, (T + sel - 1) // sel, nsa_device)
    outputs = []
    for desc in (False, True):
        o, lse = selected_fwd(q, k, v, block_idx, sel, 0.25, 0, forced=forced, tiles=dict(BQ=bq, KV_DESC=desc))
        do = torch.ones_like(o)
        cfg = dict(BWD_TILES["dq"], BQ=bq, KV_DESC=desc)
        dq = selected_bwd_dq(q, k, v, block_idx, do, lse, attn_bwd_delta(o, do), sel, 0.25, 0, cfg, forced)
        outputs.append((o, lse, dq))
    for name, plain, copied in zip(("o", "lse", "dq"), *outputs):
        assert not copied.isnan().any(), name
        assert torch.equal(plain, copied), name


#: The kernels that read selection blocks, each of which may read them in key tiles.
KEY_TILED_KERNELS = {"selected_fwd_kernel", "selected_forced_fwd_kernel", "selected_bwd_dq_kernel",
                     "selected_bwd_dq_ds_kernel", "selected_forced_dq_kernel", "selected_bwd_dkdv_kernel"}


@pytest.mark.parametrize(
    "key_tiles, sel_block, T, forced, q_offset, dq_from_ds",
    [(2, 32, 70, (1, 1), 0, True), (2, 24, 61, (0, 0), 5, False), (4, 64, 133, (2, 1), 3, True)],
    ids=["2-tiles-of-16-forced-dq-from-ds", "2-tiles-padded-noforced-off5", "4-tiles-of-16-init2-off3-dq-from-ds"],
)
def test_selected_blocks_read_in_key_tiles(key_tiles, sel_block, T, forced, q_offset, dq_from_ds, nsa_device,
                                           nsa_tolerance, monkeypatch):
    """Every selected kernel can read a block in ``KEY_TILES`` tiles of keys, which a launch too
    large for shared memory falls back to (:func:`~nsa.ops.selected.kernel.smaller_launch`): the
    output and gradients are the reference's, with forced blocks or none, a block of 24 keys (its
    second tile half padding), ``q_offset``, and the dQ from the dK/dV kernel's ``dS`` or from a
    softmax of its own; each kernel that ran took the tiles."""
    from nsa.ops.selected import kernel

    for table in (kernel.FWD_TILES, kernel.FORCED_TILES, *kernel.BWD_TILES.values()):
        monkeypatch.setitem(table, "KEY_TILES", key_tiles)
    monkeypatch.setenv("NSA_SELECTED_DQ_FROM_DS_MIB", "4096" if dq_from_ds else "0")
    config = _config(sel_block, 3, *forced)
    q, k, v = qkv(1, T, 4, 2, 16, 24, torch.float32, nsa_device, T + q_offset)
    block_idx = random_blocks(1, T, 2, 3, config.num_sel_blocks(T + q_offset), nsa_device)
    with every_launch() as launches:
        check_against_reference(q, k, v, block_idx, config, q_offset, nsa_tolerance)
    tiles = {name: kwargs.get("KEY_TILES") for name, kwargs in launches if name in KEY_TILED_KERNELS}
    want = {"selected_fwd_kernel", "selected_bwd_dkdv_kernel",
            "selected_bwd_dq_ds_kernel" if dq_from_ds else "selected_bwd_dq_kernel"}
    if sum(forced):
        want |= {"selected_forced_fwd_kernel", "selected_forced_dq_kernel"}
    assert tiles == dict.fromkeys(want, key_tiles)


def test_smaller_launches_of_the_selected_kernels():
    """A selected launch too large for shared memory drops a stage at a time, then reads each
    block in twice the key tiles, by plain loads (a bulk copy fetches a whole block), while a
    tile keeps 16 keys."""
    from nsa.ops.selected.kernel import smaller_launch

    options = dict(BSP=128, num_stages=2, KEY_TILES=1, KV_DESC=True, d_k="k's descriptor", d_v="v's", num_warps=4)
    seen = []
    while options is not None:
        seen.append((options["num_stages"], options["KEY_TILES"], options.get("KV_DESC"), "d_k" in options))
        options = smaller_launch(options)
    assert seen == [(2, 1, True, True), (1, 1, True, True), (1, 2, False, False), (1, 4, False, False),
                    (1, 8, False, False)]
    assert smaller_launch(dict(BSP=16, num_stages=1)) is None
    assert smaller_launch(dict(BSP=32, num_stages=1)) == dict(BSP=32, num_stages=1, KEY_TILES=2)


@pytest.mark.gpu
@gpu_shapes()
def test_selected_gpu_bf16(T, HQ, H, DK, DV, nsa_device, nsa_tolerance):
    """Real sizes (paper sel_block 64, 16 blocks), bfloat16 kernel vs float32 reference."""
    config = NSAConfig()
    q, k, v = qkv(1, T, HQ, H, DK, DV, torch.bfloat16, nsa_device)
    block_idx = random_blocks(1, T, H, config.sel_count, config.num_sel_blocks(T), nsa_device)
    check_against_reference(q, k, v, block_idx, config, 0, nsa_tolerance, ref_dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("bq", [2, 4])
def test_selected_gpu_tiles_of_several_queries(bq, nsa_device, nsa_tolerance, monkeypatch):
    """Real sizes with ``BQ`` query positions a program, on lists that neighbours partly share."""
    monkeypatch.setenv("NSA_SELECTED_TILE_QUERIES", str(bq))
    config, T = NSAConfig(), 2053
    q, k, v = qkv(1, T, 32, 2, 128, 128, torch.bfloat16, nsa_device)
    block_idx = random_blocks(1, T, 2, config.sel_count, config.num_sel_blocks(T), nsa_device)
    block_idx[:, :, :, ::2] = block_idx[:, torch.arange(T, device=nsa_device) // 4 * 4][:, :, :, ::2]
    check_against_reference(q, k, v, block_idx, config, 0, nsa_tolerance, ref_dtype=torch.float32)


@pytest.mark.gpu
def test_selected_gpu_backward_deterministic(nsa_device):
    config = NSAConfig()
    q, k, v = qkv(1, 4096, 32, 2, 128, 128, torch.bfloat16, nsa_device)
    block_idx = random_blocks(1, 4096, 2, 16, 64, nsa_device)
    do = torch.randn(1, 4096, 32, 128, device=nsa_device, dtype=torch.float64)
    assert_bitwise_repeatable(lambda: _forward_backward(q, k, v, block_idx, config, 0, "triton", do))


@pytest.mark.parametrize("dk, dv, warps", [(128, 128, (1, 2, 4, 4)), (192, 128, (2, 4, 8, 8)), (64, 256, (2, 4, 8, 8))])
def test_selected_warps_follow_the_head_width(dk, dv, warps):
    """Measured launch shapes at head dims up to 128; wider heads get twice the warps to hold
    their accumulators (forward, dQ, dK/dV, forced-block kernels)."""
    dims = dict(BK=dk, BV=dv, DK=dk, DV=dv, G=16)
    got = (_warps(FWD_TILES, dims, 1)["num_warps"], _warps(BWD_TILES["dq"], dims, 2)["num_warps"],
           _warps(BWD_TILES["dkdv"], dims, 4)["num_warps"], _forced_launch(dims, torch.empty(0, dtype=torch.bfloat16), backward=False)[0]["num_warps"])
    assert got == warps
    assert _warps(dict(num_warps=8), dims, 1)["num_warps"] == 8  # an explicit count stands


def test_dkdv_queries_per_program_by_launch_size():
    """132 SMs, 4 KV heads, 16 blocks a query, 64-token blocks: 512 queries a dK/dV program
    while 1024 would launch fewer than about nine programs per SM (up to 12k tokens, measured
    faster on an H100), 1024 from 14k on (measured faster there)."""
    from nsa.ops.selected.kernel import _dkdv_queries_per_program

    def qseg(T: int, batch: int = 1) -> int:
        return _dkdv_queries_per_program((batch, T, 4, 16), -(-T // 64), 132)

    assert [qseg(T) for T in (4096, 8192, 10240, 12288)] == [512] * 4
    assert [qseg(T) for T in (14336, 16384, 65536)] == [1024] * 3
    assert qseg(8192, batch=2) == 1024  # twice the programs of one sequence


def test_selected_block_copies_chosen_without_copying_inputs():
    """By default (``KV_DESC`` None) the forward takes descriptor copies only where they need no
    contiguous copy of ``k``/``v`` first; asked for them (True), it copies such inputs."""
    from nsa.ops.selected.kernel import _block_loads

    dims = dict(BSP=16, BK=32, BV=32)
    k = torch.randn(1, 40, 2, 24)
    odd = torch.randn(1, 40, 2, 21)[..., :20]  # rows 84 bytes apart: no descriptor describes it
    assert _block_loads(k, k, dims, dict(KV_DESC=None))[1]["KV_DESC"]
    assert _block_loads(k, odd, dims, dict(KV_DESC=None))[1] == {}
    cfg, loads = _block_loads(odd, odd, dims, dict(KV_DESC=True, BQ=1))
    assert cfg == dict(BQ=1) and loads["d_k"].base.is_contiguous()
    assert _block_loads(k, k, dims, dict(KV_DESC=False)) == ({}, {})
    # the dQ from dS reads K alone: no V descriptor, and a V no descriptor describes does not matter
    loads = _block_loads(k, None, dims, dict(KV_DESC=None))[1]
    assert loads["KV_DESC"] and set(loads) == {"KV_DESC", "d_k"}


@pytest.mark.parametrize(
    "G, forced, forced_done, q_offset, gated",
    [(4, (1, 1), False, 0, False), (1, (1, 2), True, 0, True), (16, (0, 0), False, 5, True)],
    ids=["G4-forced", "G1-forced-done-gated", "G16-noforced-off5-gated"],
)
def test_dq_from_the_dkdv_kernels_ds(G, forced, forced_done, q_offset, gated, nsa_device, monkeypatch):
    """By default the dK/dV kernel runs first and leaves each (query, block) pair's ``dS`` for
    the dQ kernel, which then reads ``K`` and ``dS`` instead of recomputing the softmax: the
    same gradients as with ``NSA_SELECTED_DQ_FROM_DS_MIB=0`` up to float32 rounding, with forced
    blocks (theirs left to another kernel or not), gates, ``q_offset``, G from 1 to 16 and a
    cache whose unwritten tail holds NaN (which must not reach ``dq``). ``torch.empty`` is
    NaN-filled in tests, so a pair whose ``dS`` the dK/dV kernel did not write would show."""
    from nsa.ops.selected import kernel

    buffers = []
    real = kernel.ds_buffer
    monkeypatch.setattr(kernel, "ds_buffer", lambda *a: (buffers.append(real(*a)), buffers[-1])[1])
    sel, count, H, T = 8, 4, 2, 29
    TK = T + q_offset + 6
    q, k, v = qkv(1, T, H * G, H, 16, 24, torch.float32, nsa_device, TK)
    k[:, T + q_offset:], v[:, T + q_offset:] = float("nan"), float("nan")
    block_idx = random_blocks(1, T, H, count, -(-(T + q_offset) // sel), nsa_device)
    o, lse = selected_fwd(q, k, v, block_idx, sel, 0.25, q_offset, forced=forced)
    do = torch.randn_like(o)
    gate = torch.rand(*o.shape[:3], device=nsa_device) if gated else None
    dq = torch.randn_like(q) if forced_done else None  # forced_done adds to a given dq
    out = {}
    for mib in ("4096", "0"):
        monkeypatch.setenv("NSA_SELECTED_DQ_FROM_DS_MIB", mib)
        out[mib] = selected_bwd(q, k, v, block_idx, o, lse, do, sel, 0.25, q_offset, forced=forced,
                                dq=None if dq is None else dq.clone(), gate=gate, forced_done=forced_done)
    assert buffers[0] is not None and buffers[1] is None
    for name, got, want in zip(("dq", "dk", "dv"), out["4096"], out["0"]):
        got, want = got[:, : T + q_offset], want[:, : T + q_offset]  # keys past the last query: V is NaN there
        assert torch.isfinite(got).all()
        assert_close(name, got, want, 1e-5)


def test_ds_buffer_only_within_its_budget(nsa_device, monkeypatch):
    """The dS buffer is ``[B, T, H, n, G, sel_block]`` in q's dtype; none when it would pass
    ``NSA_SELECTED_DQ_FROM_DS_MIB`` (by default an eighth of the GPU's memory, 4 GiB on CPU; 0
    turns it off) or the dQ takes several query positions a program."""
    from nsa.ops.selected.kernel import ds_budget, ds_buffer

    monkeypatch.delenv("NSA_SELECTED_DQ_FROM_DS_MIB", raising=False)
    if nsa_device.type == "cuda":
        assert ds_budget(nsa_device) == torch.cuda.get_device_properties(nsa_device).total_memory // 8
    else:
        assert ds_budget(nsa_device) == 4 * 2**30
    monkeypatch.setenv("NSA_SELECTED_DQ_FROM_DS_MIB", "0")
    assert ds_budget(nsa_device) == 0

    q = torch.empty(2, 512, 32, 16, device=nsa_device)  # G = 16 over H = 2
    block_idx = torch.zeros(2, 512, 2, 16, device=nsa_device, dtype=torch.int32)
    size = 2 * 512 * 2 * 16 * 16 * 64 * 4  # 16 MiB
    monkeypatch.setenv("NSA_SELECTED_DQ_FROM_DS_MIB", str(size // 2**20))
    buf = ds_buffer(q, block_idx, 64, dict(BQ=0))
    assert buf.shape == (2, 512, 2, 16, 16, 64) and buf.dtype == q.dtype
    assert ds_buffer(q, block_idx, 64, dict(BQ=2)) is None
    monkeypatch.setenv("NSA_SELECTED_TILE_QUERIES", "4")
    assert ds_buffer(q, block_idx, 64, dict(BQ=0)) is None
    monkeypatch.delenv("NSA_SELECTED_TILE_QUERIES")
    monkeypatch.setenv("NSA_SELECTED_DQ_FROM_DS_MIB", str(size // 2**20 - 1))
    assert ds_buffer(q, block_idx, 64, dict(BQ=0)) is None


def test_dq_from_ds_copies_only_while_k_is_small(nsa_device, monkeypatch):
    """The dQ from ``dS`` fetches its key blocks by bulk copies where they run (Hopper and later,
    and the interpreter) while K takes at most ``DQ_DS_COPIES_MAX_BYTES``, by plain loads beyond;
    both give the same ``dq``, and an explicit ``KV_DESC`` is left alone."""
    from nsa.ops.selected import kernel

    chosen = []
    real = kernel._block_loads

    def block_loads(*args):
        cfg, loads = real(*args)
        chosen.append(loads.get("KV_DESC", False))
        return cfg, loads

    monkeypatch.setattr(kernel, "_block_loads", block_loads)
    monkeypatch.setenv("NSA_SELECTED_DQ_FROM_DS_MIB", "4096")
    sel, count, H, G, T = 8, 3, 2, 4, 21
    q, k, v = qkv(1, T, H * G, H, 16, 16, torch.float32, nsa_device, T)
    block_idx = random_blocks(1, T, H, count, -(-T // sel), nsa_device)
    o, lse = selected_fwd(q, k, v, block_idx, sel, 0.25, 0)
    do = torch.randn_like(o)
    k_bytes = k.numel() * k.element_size()
    copies = kernel.bulk_copies_supported(nsa_device)
    out = {}
    for limit in (k_bytes, k_bytes - 1):
        monkeypatch.setattr(kernel, "DQ_DS_COPIES_MAX_BYTES", limit)
        chosen.clear()
        out[limit] = selected_bwd(q, k, v, block_idx, o, lse, do, sel, 0.25, 0)
        assert chosen == [copies and limit == k_bytes]  # the dQ's is the one launch through _block_loads
    for got, want in zip(out[k_bytes], out[k_bytes - 1]):
        assert_close("d", got, want, 1e-5)
    if copies:  # copies asked for explicitly need a GPU that has them
        chosen.clear()
        selected_bwd(q, k, v, block_idx, o, lse, do, sel, 0.25, 0,
                     tiles={"dq_ds": dict(BWD_TILES["dq_ds"], KV_DESC=True)})
        assert chosen == [True]
