"""Triton block selection (``select_blocks``) against the reference: same blocks.

On CPU the kernel runs through Triton's interpreter at small sizes; the ``gpu``
cases run real sizes in bfloat16. Where two candidate blocks score within
rounding of each other, the order of summation may legitimately pick either, so
random-input cases check that the kernel's choice is a valid top-n under the
reference's scores (``nsa.testing.assert_valid_selection``), and identical wherever no such near-tie
exists; exact ties are tested separately with inputs whose scores are exact.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

import triton
import triton.language as tl

from _kernel_inputs import every_launch, spy_launches
from nsa import NSAConfig
from nsa.ops import select_blocks
from nsa.ops._triton.compressed_fwd import _step_tokens
from nsa.ops._triton.device import min_dot_side
from nsa.ops.compressed.reference import visible_cmp_count
from nsa.testing import assert_close, assert_valid_selection, block_scores

pytestmark = [pytest.mark.triton, pytest.mark.parity]

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4, init_blocks=1, local_blocks=2)


def _run(shape, config, q_offset, dtype, device, extra_tokens=0):
    B, T, HQ, H, D = shape
    nc = config.num_cmp(q_offset + T) + extra_tokens
    q = torch.randn(B, T, HQ, D, device=device, dtype=dtype)
    k_cmp = torch.randn(B, nc, H, D, device=device, dtype=dtype)
    idx = select_blocks(q, k_cmp, config, q_offset=q_offset, backend="triton")
    ref = select_blocks(q.double(), k_cmp.double(), config, q_offset=q_offset, backend="reference")
    assert_valid_selection(idx, ref, block_scores(q, k_cmp, config, q_offset=q_offset), config, q_offset=q_offset)
    return idx, ref


@pytest.mark.parametrize(
    "shape, config, q_offset",
    [
        pytest.param((1, 77, 4, 1, 32), SMALL, 0, id="B1-T77-HQ4-H1-D32"),
        pytest.param((2, 61, 2, 2, 16), SMALL, 0, id="B2-T61-HQ2-H2-D16-G1"),
        pytest.param((1, 53, 16, 1, 16), SMALL, 0, id="B1-T53-HQ16-H1-D16-G16"),
        pytest.param((1, 45, 4, 1, 24), SMALL, 70, id="B1-T45-HQ4-H1-D24-offset70"),
        pytest.param((1, 90, 3, 1, 16), NSAConfig(cmp_block=12, cmp_stride=4, sel_block=12, sel_count=5), 0,
                     id="B1-T90-HQ3-D16-R3-G3"),
        pytest.param((1, 100, 2, 2, 16), NSAConfig(cmp_block=32, cmp_stride=8, sel_block=8, sel_count=6, init_blocks=2),
                     0, id="B1-T100-D16-l32-sel8"),
        pytest.param((1, 70, 4, 2, 16), NSAConfig(cmp_block=8, cmp_stride=8, sel_block=16, sel_count=3, local_blocks=1,
                                                  init_blocks=0), 3, id="B1-T70-D16-noinit"),
    ],
)
def test_select_matches_reference(shape, config, q_offset, nsa_device):
    idx, ref = _run(shape, config, q_offset, torch.float32, nsa_device)
    # float32 on random inputs has no near-ties in practice: exactly the reference
    assert torch.equal(idx.long(), ref.long())


@pytest.mark.parametrize(
    "shape, config, q_offset",
    [
        pytest.param((2, 61, 2, 2, 16), SMALL, 0, id="B2-T61-HQ2-H2-D16-G1"),
        pytest.param((1, 45, 4, 1, 24), SMALL, 70, id="B1-T45-HQ4-H1-D24-offset70"),
        pytest.param((1, 90, 3, 1, 16), NSAConfig(cmp_block=12, cmp_stride=4, sel_block=12, sel_count=5), 0,
                     id="B1-T90-HQ3-D16-R3-G3"),
    ],
)
def test_select_in_float16_is_a_valid_selection(shape, config, q_offset, nsa_device):
    """16-bit inputs (the float32 cases' geometries, a few of them): the blocks are the reference's
    but where near-ties in the 16-bit scores swap them (checked by the scores' margins)."""
    _run(shape, config, q_offset, torch.float16, nsa_device)


def test_select_cache_buffer_and_few_blocks(nsa_device):
    """Extra compressed tokens past the last query are never read; with at most n visible
    blocks every one is chosen and the rest is -1."""
    config = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=8)
    idx, ref = _run((1, 40, 4, 2, 16), config, 0, torch.float32, nsa_device, extra_tokens=5)
    assert torch.equal(idx.long(), ref.long())
    assert (idx[0, -1, :, 3:] == -1).all() and (idx[0, -1, :, :3] == torch.arange(3, device=nsa_device)).all()


def test_select_exact_ties_go_to_lower_block(nsa_device):
    """q = 0 gives uniform probabilities; where the visible count is a power of two every
    score is exact, full blocks tie, and the lowest indices win (as in the reference)."""
    config = SMALL
    B, T, HQ, H, D = 1, 140, 4, 1, 16
    q = torch.zeros(B, T, HQ, D, device=nsa_device)
    k_cmp = torch.randn(B, config.num_cmp(T), H, D, device=nsa_device)
    idx = select_blocks(q, k_cmp, config, backend="triton")
    ref = select_blocks(q.double(), k_cmp.double(), config, backend="reference")
    counts = visible_cmp_count(torch.arange(T, device=nsa_device), config)
    exact = (counts & (counts - 1)) == 0
    assert exact.sum() > 10
    assert torch.equal(idx[:, exact].long(), ref[:, exact].long())
    # t = 132 sees 32 tokens and blocks 0..8; blocks 1..7 tie at 4/32: init 0, lowest free 1, local 7, 8
    assert idx[0, 132, 0].tolist() == [0, 1, 7, 8]


@pytest.mark.gpu
@pytest.mark.parametrize("T, HQ, H", [(4096, 64, 4), (3001, 16, 16), (2053, 16, 1)], ids=["T4096-G16", "T3001-G1", "T2053-G16-H1"])
def test_select_gpu_bf16(T, HQ, H, nsa_device):
    config = NSAConfig()
    _run((1, T, HQ, H, 128), config, 0, torch.bfloat16, nsa_device)


def test_select_in_query_chunks_equals_one_launch(nsa_device):
    """A small score buffer splits the queries into launches (the last one partial, B > 1):
    the blocks, ``o`` and ``lse`` equal those of a single launch."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd, query_chunk

    config = SMALL
    B, T, HQ, H, D = 2, 51, 4, 2, 16  # four launches of 16, 16, 16 and 3 queries
    q = torch.randn(B, T, HQ, D, device=nsa_device)
    k = torch.randn(B, config.num_cmp(T + 9), H, D, device=nsa_device)
    v = torch.randn(B, config.num_cmp(T + 9), H, D, device=nsa_device)
    scale = config.softmax_scale(D)
    nsel = config.num_sel_blocks(9 + T)
    budget = 18 * B * H * nsel * 4  # 18 queries' scores: chunks of 16 with 4-query tiles (8 rows, G = 2)
    assert query_chunk(B, T, H, nsel, 4, budget) == 16
    whole = compressed_fwd(q, k, v, config, scale, 9, select=True, rows=8)
    chunked = compressed_fwd(q, k, v, config, scale, 9, select=True, rows=8, score_buffer_bytes=budget)
    for a, b in zip(whole, chunked):
        assert torch.equal(a, b)
    ref = select_blocks(q.double(), k.double(), config, q_offset=9, backend="reference")
    assert torch.equal(chunked[2].long(), ref.long())


def _pass2_apart_case(nsa_device, monkeypatch):
    """The small compressed forward of the ``PASS2_APART`` tests: ``SHORT_TOKENS`` 0 (the long walks
    at any length), ``G = 3`` padded to 4 head rows, B > 1, a query offset, a score budget of four query
    chunks (32, 32, 32 and 4 queries) and queries that choose 2 of up to 10 free blocks; pass 2 apart
    with its own tiles (8 blocks a step, query tiles of 8 positions) and pass 1 in query tiles of 16
    rows. Returns ``(module, config, q, k, q_offset, run)``, ``run(**tiles)`` the launch with the budget."""
    from nsa.ops._triton import compressed_fwd as module

    monkeypatch.setattr(module, "SHORT_TOKENS", 0)
    config = dataclasses.replace(SMALL, sel_block=8, sel_count=5)
    B, T, HQ, H, D, q_offset = 2, 100, 6, 2, 16, 9  # G = 3, padded to 4 head rows
    q = torch.randn(B, T, HQ, D, device=nsa_device, dtype=torch.float16)
    k, v = (torch.randn(B, config.num_cmp(q_offset + T), H, D, device=nsa_device, dtype=torch.float16)
            for _ in range(2))
    scale = config.softmax_scale(D)
    planes = module._score_geometry(config)["NSPILL"]
    budget = 40 * B * H * config.num_sel_blocks(q_offset + T) * planes * 4  # chunks of 32, 32, 32 and 4 queries
    run = lambda **tiles: module.compressed_fwd(q, k, v, config, scale, q_offset, select=True,  # noqa: E731
                                                score_buffer_bytes=budget, **tiles)
    monkeypatch.setitem(module.PASS2_APART, "enabled", True)
    monkeypatch.setitem(module.PASS2_APART, "blocks_per_step", 8)
    monkeypatch.setitem(module.PASS2_APART, "rows", 32)
    # pass 1's own launch given in rows, as the default is (the register cap binds on a GPU alone)
    monkeypatch.setitem(module.PASS2_APART, "pass1", dict(rows=16, num_warps=8, num_stages=2, maxnreg=128))
    return module, config, q, k, q_offset, run


def test_pass2_apart_equals_the_fused_launch(nsa_device, monkeypatch):
    """``PASS2_APART``: where the long walks take their default tiles tuned on Hopper (16-bit inputs;
    :func:`_pass2_apart_case`), pass 1 runs once over every query (``o``, ``lse`` and the log2-domain
    lse), then each query chunk's pass 2 in a launch of its own with its own tiles (against the fused
    launch's 32 blocks a step and 16 positions). ``o``, ``lse`` and the blocks equal the fused launch's
    bitwise on a GPU, and the blocks are the reference's. A caller's tiles keep pass 2 fused. Under the
    interpreter a product is numpy's matmul, whose summation order may follow its operands' shapes (on
    an AMD EPYC, session 69: 2 of 19200 ``o`` elements one float16 step apart, ``lse`` one float32
    step), so there ``o`` and ``lse`` agree within rounding and the blocks exactly."""
    module, config, q, k, q_offset, run = _pass2_apart_case(nsa_device, monkeypatch)
    monkeypatch.setitem(module.PASS2_APART, "enabled", False)
    fused = run()
    monkeypatch.setitem(module.PASS2_APART, "enabled", True)
    launches_of = lambda launches: [(kw.get("PASS1", True), kw["SELECT"], kw["NB"], kw["BT"])  # noqa: E731
                                    for name, kw in launches if name == "compressed_fwd_kernel"]
    with every_launch() as launches:
        apart = run()
    assert launches_of(launches) == [(True, False, 32, 4)] + [(False, True, 8, 8)] * 4
    for name, a, b in zip(("o", "lse", "block_idx"), fused, apart):
        if name == "block_idx" or nsa_device.type == "cuda":
            assert torch.equal(a, b), name
        else:
            assert_close(f"{name}, pass 2 apart against fused", b, a, 1e-4)
    ref = select_blocks(q.double(), k.double(), config, q_offset=q_offset, backend="reference")
    assert_valid_selection(apart[2], ref, block_scores(q, k, config, q_offset=q_offset), config, q_offset=q_offset)
    with every_launch(execute=False) as launches:
        run(block_n=64)
    assert launches_of(launches) == [(True, True, 32, 16)] * 4


def test_pass2_apart_pass1_through_descriptors(nsa_device, monkeypatch):
    """In :func:`_pass2_apart_case`'s launch, pass 1 reading its whole key tiles through tensor
    descriptors (8-token tiles; on a GPU 16, the least its dot takes) leaves the same ``o``, ``lse``
    and blocks as plain loads, bitwise; the last query tiles read whole tiles."""
    module, config, q, k, q_offset, run = _pass2_apart_case(nsa_device, monkeypatch)
    bn = max(8, min_dot_side(q.device))
    monkeypatch.setitem(module.PASS2_APART, "pass1", dict(rows=16, BN=bn, num_warps=8, num_stages=2, maxnreg=128))
    plain = run()
    monkeypatch.setitem(module.PASS2_APART, "pass1",
                        dict(rows=16, BN=bn, num_warps=8, num_stages=2, maxnreg=128, kv_desc=True))
    with every_launch() as launches:
        described = run()
    assert [kw.get("KV_DESC", False) for name, kw in launches if name == "compressed_fwd_kernel"] == [True] + [False] * 4
    assert config.num_cmp(q_offset + q.shape[1] - 16) >= bn  # the last query tiles read whole tiles
    for name, a, b in zip(("o", "lse", "block_idx"), plain, described):
        assert torch.equal(a, b), name


@pytest.mark.gpu
def test_pass2_apart_equals_the_fused_launch_real_size(nsa_device, monkeypatch):
    """At 20k tokens every query chunk takes the long walks' tiles, and pass 2 runs apart by
    default: ``o``, ``lse`` and the blocks equal the fused launch's bitwise (bf16, the paper's
    geometry). Pass 1 is the Triton launch here; on Hopper the Gluon one runs by default, and
    ``test_gluon_pass1.py`` compares the two."""
    from nsa.ops._triton import compressed_fwd as module

    monkeypatch.setenv("NSA_GLUON_COMPRESSED_PASS1", "0")
    config = NSAConfig()
    T = 20000 + 37
    assert config.num_cmp(T) > module.SHORT_TOKENS and module.PASS2_APART["enabled"]
    q = torch.randn(1, T, 64, 128, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, config.num_cmp(T), 4, 128, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    run = lambda: module.compressed_fwd(q, k, v, config, config.softmax_scale(128), 0, select=True)
    apart = run()
    monkeypatch.setitem(module.PASS2_APART, "enabled", False)
    fused = run()
    for name, a, b in zip(("o", "lse", "block_idx"), fused, apart):
        assert torch.equal(a, b), name


def test_short_tiles_while_no_query_sees_more_than_short_tokens(nsa_device, monkeypatch):
    """A call whose queries see at most ``SHORT_TOKENS`` compressed tokens launches every query
    chunk with ``SHORT_TILES`` (16-bit inputs), a longer one with the wide tiles, and a caller's
    explicit tiles turn the choice off. Either way: the reference's ``o`` and ``lse`` and a valid
    top-n (the same blocks but for near-ties, which other tiles may sum in another order)."""
    from nsa.ops._triton import compressed_fwd as module
    from nsa.ops.compressed.reference import compressed_attention as reference_attention

    # the pass-1 token tile, pass-2 blocks a step and stages of each launch (of the fused kernel: the
    # long walks' pass 2 apart has its own test)
    monkeypatch.setitem(module.PASS2_APART, "enabled", False)
    launched = spy_launches(monkeypatch, module, "compressed_fwd_kernel", "BN", "NB", "num_stages")
    config = SMALL
    B, T, HQ, H, D, q_offset = 1, 29, 4, 2, 16, 9  # two chunks of queries, whose last ones see 5 and 8 tokens
    q = torch.randn(B, T, HQ, D, device=nsa_device, dtype=torch.float16)
    k, v = (torch.randn(B, config.num_cmp(q_offset + T), H, D, device=nsa_device, dtype=torch.float16)
            for _ in range(2))
    scale = config.softmax_scale(D)
    budget = 18 * B * H * config.num_sel_blocks(q_offset + T) * module._score_geometry(config)["NSPILL"] * 4
    run = lambda **kw: module.compressed_fwd(q, k, v, config, scale, q_offset, select=True, rows=8,
                                             score_buffer_bytes=budget, **kw)
    short = (module.SHORT_TILES["block_n"], module.SHORT_TILES["blocks_per_step"], module.SHORT_TILES["num_stages"])
    ref_o, ref_lse = reference_attention(q.double(), k.double(), v.double(), config, scale, q_offset)
    ref_idx = select_blocks(q.double(), k.double(), config, q_offset=q_offset, backend="reference")
    finite = torch.isfinite(ref_lse)
    # 7 tokens: the first chunk's queries alone would fit, but the choice is the whole call's
    for tokens, explicit, want in ((8, {}, short), (7, {}, (64, 32, 3)), (8, dict(block_n=16), (16, 32, 3))):
        monkeypatch.setattr(module, "SHORT_TOKENS", tokens)
        launched.clear()
        o, lse, idx = run(**explicit)
        assert launched == [want] * 2
        assert_close("o", o, ref_o, 2e-3)
        assert torch.equal(torch.isfinite(lse), finite)
        assert_close("lse", lse[finite], ref_lse[finite], 1e-3)
        assert_valid_selection(idx, ref_idx, block_scores(q, k, config, q_offset=q_offset), config, q_offset=q_offset)


@pytest.mark.parametrize("HQ, H, T, local", [(4, 1, 141, 2), (6, 2, 134, 2), (4, 1, 141, 0)],
                         ids=["G4", "G3-padded-heads", "G4-own-block-free"])
def test_select_with_unmasked_score_steps(HQ, H, T, local, nsa_device):
    """Steps of 4 blocks (16 compressed tokens): past the first tiles, pass 2 runs most steps
    without masks (every row of the tile sees every token); padding head rows (G = 3),
    queries past the last and tokens a row cannot see yet (which would land in its own
    block, scored when no local block is forced) must still add nothing. Same blocks as
    the reference."""
    from nsa.ops._triton.compressed_fwd import compressed_fwd

    config = dataclasses.replace(SMALL, local_blocks=local)
    q = torch.randn(1, T, HQ, 16, device=nsa_device)
    k = torch.randn(1, config.num_cmp(T), H, 16, device=nsa_device)
    _, _, idx = compressed_fwd(q, k, k, config, config.softmax_scale(16), 0, select=True, blocks_per_step=4)
    ref = select_blocks(q.double(), k.double(), config, backend="reference")
    assert_valid_selection(idx, ref, block_scores(q, k, config, q_offset=0), config, q_offset=0)
    assert torch.equal(idx.long(), ref.long())


def test_block_topn_rules(nsa_device):
    """Hand-made scores: forced blocks win over any score, ties go to the lower block,
    a query with at most n visible blocks takes them all, and blocks past the query's own
    are never read (they hold NaN here). The same scores split over two planes (half of
    block j's score is mass spilled from block j - 1, in plane 1 at block j; plane 1 at block
    0 holds NaN) choose the same blocks."""
    from nsa.ops._triton.block_topn import block_topn

    sel_block, n = 4, 4
    T, nsel = 24, 6  # positions 0..23: own block t // 4
    scores = torch.full((1, T, 1, nsel), float("nan"), device=nsa_device)
    for t in range(T):
        own = t // sel_block
        scores[0, t, 0, : own + 1] = torch.tensor([0.0, 0.5, 0.5, 0.25, 0.5, 0.0][: own + 1])
    spilled = torch.full((1, T, 1, 2, nsel), float("nan"), device=nsa_device)
    spilled[:, :, :, 0] = scores / 2
    spilled[:, :, :, 1, 1:] = scores[..., 1:] / 2  # plane 1 at j adds into block j
    for planes in (scores.unsqueeze(3), spilled):
        idx = torch.full((1, T, 1, n), 99, dtype=torch.int32, device=nsa_device)
        block_topn(planes, idx, 0, 0, sel_block, 1, 2)
        # t in block 5 sees 6 blocks: forced 0, 4, 5; one free pick among 1, 2 (tie at 0.5), 3 -> 1
        assert idx[0, 23, 0].tolist() == [0, 1, 4, 5]
        # t in block 4: forced 0, 3, 4 (3 is local despite its low score); free pick 1 beats 2 on the tie
        assert idx[0, 16, 0].tolist() == [0, 1, 3, 4]
        # t in block 2 sees 3 <= n blocks: all of them, then -1
        assert idx[0, 9, 0].tolist() == [0, 1, 2, -1]
        assert idx[0, 0, 0].tolist() == [0, -1, -1, -1]


def _topn_reference(scores: torch.Tensor, t_first: int, sel_block: int, n: int, init: int, local: int) -> torch.Tensor:
    """The spec's top-n of ``scores [B, TC, H, 1, nsel]`` (float64 rules): each query's visible blocks
    (up to its own), forced ones first, then by score, ties to the lower block; ascending, -1 padded."""
    B, TC, H, _, nsel = scores.shape
    out = torch.full((B, TC, H, n), -1, dtype=torch.int32)
    for b, t, h in itertools.product(range(B), range(TC), range(H)):
        own = (t_first + t) // sel_block
        row = scores[b, t, h, 0, : own + 1].double().cpu()
        key = torch.where((torch.arange(own + 1) < init) | (torch.arange(own + 1) > own - local), float("inf"), row)
        order = torch.sort(-key, stable=True).indices[:n]
        out[b, t, h, : order.numel()] = order.sort().values.to(torch.int32)
    return out


@pytest.mark.parametrize("bounds", [True, False], ids=["bounded-rounds", "all-rounds"])
@pytest.mark.parametrize("kind", ["spread", "one-binade", "ties", "zeros", "forced-fill"])
def test_block_topn_against_the_rule(kind, bounds, nsa_device, monkeypatch):
    """Random rows of up to 58 blocks against :func:`_topn_reference`, including rows whose scores
    share a binade (the radix select's bounds then fix many bits), exact ties, all-zero rows, rows
    that see fewer blocks than n, and forced blocks that fill n by themselves; with the rounds
    bounded (the default) and all 31."""
    from nsa.ops._triton import block_topn as topn
    from nsa.ops._triton.block_topn import block_topn

    monkeypatch.setitem(topn.LAUNCH, "bounds", bounds)
    torch.manual_seed(len(kind))
    sel_block, n, T, H, t_first = 4, 6, 24, 3, 208
    nsel = (t_first + T - 1) // sel_block + 1  # 58 blocks: the last query's own is the last
    shape = (1, T, H, 1, nsel)
    if kind == "spread":
        scores = torch.rand(shape) * torch.exp2(torch.randint(-40, 10, shape).float())
    elif kind == "one-binade":
        scores = 1.0 + torch.rand(shape) * 1e-3
    elif kind == "ties":
        scores = torch.randint(0, 3, shape).float() / 4
    else:
        scores = torch.zeros(shape)
    init, local = (4, 3) if kind == "forced-fill" else (1, 2)
    # from 0 the first queries see fewer than n blocks; a chunk of 8 from 0, rows narrower than n
    for queries, first in ((T, t_first), (T, 0), (8, 0)):
        chunk = scores[:, :queries].contiguous()
        buffer = torch.full((queries * H * n + 16,), 99, dtype=torch.int32, device=nsa_device)
        idx = buffer[: queries * H * n].view(1, queries, H, n)  # 16 entries past it: a row writes only its n
        block_topn(chunk.to(nsa_device), idx, 0, first, sel_block, init, local)
        want = _topn_reference(chunk, first, sel_block, n, init, local)
        assert torch.equal(idx.cpu(), want), (kind, queries, first)
        assert (buffer[queries * H * n :] == 99).all(), (kind, queries, first)


def test_block_topn_two_planes_poisoned_past_each_own_block(nsa_device):
    """Rows of 64 blocks (a multiple of 16: the kernel then reads whole 16-block pieces up to each
    query's own block) in two planes (plane 1 at block j: the mass block j - 1 spills into j), every
    entry past a query's own block and plane 1 at block 0 poisoned with NaN: the same blocks as the
    rule on the planes' sum, from queries whose own block lies anywhere in a piece."""
    from nsa.ops._triton.block_topn import block_topn

    torch.manual_seed(64)
    sel_block, n, T, H, nsel = 4, 6, 256, 2, 64
    whole = torch.rand(1, T, H, 1, nsel)
    spill = torch.rand(1, T, H, 1, nsel) * whole  # up to the whole score, so that the planes differ
    planes = torch.cat([whole - spill, spill], 3)
    own = torch.arange(T) // sel_block
    past = torch.arange(nsel)[None, :] > own[:, None]  # [T, nsel]
    planes = torch.where(past[None, :, None, None, :], float("nan"), planes)
    planes[:, :, :, 1, 0] = float("nan")
    idx = torch.full((1, T, H, n), 99, dtype=torch.int32, device=nsa_device)
    block_topn(planes.to(nsa_device), idx, 0, 0, sel_block, 1, 2)
    summed = (planes[:, :, :, 0] + torch.nan_to_num(planes[:, :, :, 1], nan=0.0)).unsqueeze(3)
    summed[:, :, :, :, 0] = planes[:, :, :, :1, 0]
    assert torch.equal(idx.cpu(), _topn_reference(summed, 0, sel_block, n, 1, 2))


def test_block_topn_reads_a_row_in_wide_loads_first(tmp_path):
    """Compiled for sm_90 as the 64k forward's last chunks launch it (rows of 1024 blocks, ``nsel`` a
    multiple of 16, :func:`~nsa.ops._triton.block_topn.row_warps`' warps): each thread reads its share
    of both planes by 16-byte loads, all issued before the first mass is added. Masked block by block,
    the kernel read scalar loads and waited for each pair before issuing the next (Nsight Compute on
    the H200: 41 % of the stall samples on reading the rows, docs/perf/prefill.md, session 75)."""
    import re

    from _gluon_kernels import hopper_sass
    from nsa.ops._triton.block_topn import row_warps

    ops = [re.sub(r"^@!?U?P\w+\s+", "", line.split("*/", 1)[1].strip())
           for line in hopper_sass("nsa.ops._triton.block_topn", tmp_path, nsel=1024).splitlines()
           if line.strip().startswith("/*") and "*/" in line]
    ops = [op for op in ops if op]
    wide = 2 * 1024 // (32 * row_warps(1024)) // 4  # both planes' keys of a thread, 4 a load
    loads = [op.split()[0] for op in ops if op.startswith("LDG")]
    first_add = next(i for i, op in enumerate(ops) if op.startswith("FADD"))
    assert loads == ["LDG.E.128"] * wide, loads
    assert sum(op.startswith("LDG") for op in ops[:first_add]) == wide


@triton.jit
def _step_columns_kernel(out, i_j, NB: tl.constexpr, R: tl.constexpr, RP: tl.constexpr):
    """``out [3, NB * RP]``: each column's block, token and token index (:func:`_step_tokens`)."""
    jb, r, tok = _step_tokens(i_j, NB, R, RP)
    o_c = tl.arange(0, NB * RP)
    tl.store(out + o_c, jb)
    tl.store(out + NB * RP + o_c, r)
    tl.store(out + 2 * NB * RP + o_c, tok)


@pytest.mark.parametrize("NB, R, RP", [(32, 4, 4), (4, 3, 4), (8, 1, 1), (16, 2, 2), (2, 8, 8)],
                         ids=["paper", "padded", "one-token", "two-token", "two-block"])
def test_step_columns_cover_each_token_once(NB, R, RP, nsa_device):
    """The scoring step's column order (``_step_tokens``): every (block, token) pair of a step
    appears in exactly one column, and each column's token index is ``(i_j + block) * R + token``.
    The block masses are sums over the columns that hold a block's tokens, so a column twice
    or never would count a token twice or drop it."""
    i_j = 7
    out = torch.full((3, NB * RP), -1, dtype=torch.int32, device=nsa_device)
    _step_columns_kernel[(1,)](out, i_j, NB=NB, R=R, RP=RP)
    jb, r, tok = out.long().cpu()
    assert sorted(zip(jb.tolist(), r.tolist())) == [(b, t) for b in range(NB) for t in range(RP)]
    assert torch.equal(tok, (i_j + jb) * R + r)
