"""The compressed forward's scoring pass in Gluon (Hopper, ``NSA_GLUON_COMPRESSED_SCORES``) against the
Triton launch.

Gluon has no CPU interpreter, so the comparisons run on Hopper GPUs only; on CPU the kernel is
compiled for sm_90 with the installed Triton. The Triton launch the GPU tests compare with is checked
against the float64 reference in ``test_compressed_kernel.py``.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from _gluon_kernels import assert_compiles_for_hopper, record_launches, skip_without_hopper

from nsa import NSAConfig
from nsa.testing import assert_close


def test_gluon_scores_compiles_for_hopper(tmp_path):
    """The kernel compiles for sm_90 with the installed Triton, no GPU needed (Gluon's API moves
    between releases). It fits Hopper's 227 KiB of shared memory a block, and its partitions take the
    registers its launch gives them (computing warpgroups 240, the copy warp 24)."""
    assert_compiles_for_hopper("nsa.ops.compressed.gluon_scores", tmp_path, G=16)


def test_gluon_scores_takes_what_its_copies_and_blocks_allow():
    """Where the Gluon scoring pass applies, device aside: 16-bit contiguous inputs with 128-wide heads
    and 8-64 heads a KV head (:func:`shapes_fit`), selection blocks of a power of two compressed tokens
    up to 64 (:func:`geometry_fits`); and never on CPU tensors."""
    from nsa.ops.compressed import gluon_scores

    def case(HQ=16, H=1, D=128, dtype=torch.bfloat16):
        return gluon_scores.shapes_fit(torch.randn(1, 64, HQ, D, dtype=dtype), torch.randn(1, 3, H, D, dtype=dtype))

    assert case() and case(HQ=64, H=8) and case(HQ=32, H=4) and case(dtype=torch.float16)
    assert not case(D=64) and not case(HQ=12) and not case(HQ=4) and not case(dtype=torch.float32)
    assert [r for r in range(0, 130) if gluon_scores.geometry_fits(r)] == [1, 2, 4, 8, 16, 32, 64]
    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    assert not gluon_scores.fits(q, q[:, :3, :1], 4)


@pytest.mark.parametrize("G", [8, 16, 32, 64])
def test_gluon_scores_column_order_holds_every_row_once_with_heads_in_registers(G):
    """The product's 128 columns (:func:`position_bit`, :func:`bit_rank`) hold each of the program's
    ``128 // G`` positions' ``G`` heads once; the heads take the accumulator's register bits (column
    bits 0 and 3-6) before its lane bits (1 and 2), so that up to 32 heads a position sum inside a
    thread; and :func:`head_axis` sums them highest axis first, each sum leaving the next one's axis
    in place."""
    from nsa.ops.compressed.gluon_scores import bit_rank, head_axis, position_bit

    def owner(c):
        pos = sum(((c >> b) & 1) << bit_rank(G, b) for b in range(7) if position_bit(G, b))
        head = sum(((c >> b) & 1) << bit_rank(G, b) for b in range(7) if not position_bit(G, b))
        return pos, head

    assert sorted(owner(c) for c in range(128)) == [(p, h) for p in range(128 // G) for h in range(G)]
    head_bits = [b for b in range(7) if not position_bit(G, b)]
    assert len(head_bits) == G.bit_length() - 1
    lane_bits = {1, 2}
    assert set(head_bits) & lane_bits == (set() if G <= 32 else {2})
    axes = [head_axis(G, i) for i in range(len(head_bits))]
    assert axes == sorted(axes, reverse=True) and axes == [7 - b for b in head_bits]


def _scores_read(chunks, B, H, q_offset, sel_block):
    """The block masses the top-n kernel reads, chunk after chunk (``(t0, scores [B, TC, H, planes,
    nsel])``): a query's plane ``s`` from block ``s`` up to its own, flattened."""
    read = []
    for t0, sc in chunks:
        _, TC, _, planes, nsel = sc.shape
        own = (q_offset + t0 + torch.arange(TC, device=sc.device)) // sel_block
        o_j = torch.arange(nsel, device=sc.device)[None, None, :]
        shift = torch.arange(planes, device=sc.device)
        m = (o_j <= own[:, None, None]) & (o_j >= shift[None, :, None])  # [TC, planes, nsel]
        read.append(sc[m[None, :, None].expand(B, TC, H, planes, nsel)])
    return torch.cat(read)


@pytest.mark.gpu
@pytest.mark.parity
@pytest.mark.parametrize(
    "B, T, HQ, H, q_offset, geometry, chunk_bytes",
    [(1, 20480, 64, 4, 0, {}, None), (2, 17001, 16, 1, 0, {}, 64 << 20), (1, 18000, 32, 4, 300, {}, 32 << 20),
     (1, 16900, 64, 1, 1000, {}, None), (1, 18500, 16, 2, 77, dict(sel_block=32, cmp_block=64), 48 << 20),
     (1, 17000, 16, 1, 0, dict(sel_block=128), None)],
    ids=["T20480-G16", "B2-T17001-G16-chunks", "T18000-G8-offset300-chunks", "T16900-G64-offset1000",
         "T18500-3-planes-offset77-chunks", "T17000-8-tokens-a-block"],
)
def test_gluon_scores_match_triton(B, T, HQ, H, q_offset, geometry, chunk_bytes, nsa_device, monkeypatch):
    """The block masses the top-n reads with the Gluon scoring pass equal the Triton launch's to float32
    rounding (written into a buffer poisoned with NaN), and so do the selections (but for ties that
    rounding may break); ``o`` and ``lse`` are pass 1's, the same. Past 16k tokens, where pass 2 runs
    apart, with a batch, ``q_offset``, 8-64 heads a KV head, query chunks (the launches' ``T0 > 0``),
    lengths that end inside a query tile, 2-8 compressed tokens a block and three planes of masses."""
    skip_without_hopper(nsa_device, "the Gluon scoring pass")
    from nsa.ops._triton import block_topn as topn_module
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import gluon_scores

    launch = gluon_scores.compressed_scores_gluon

    def poisoned_launch(q, k_cmp, lse2, scores, *args):
        scores.fill_(float("nan"))
        launch(q, k_cmp, lse2, scores, *args)

    monkeypatch.setattr(gluon_scores, "compressed_scores_gluon", poisoned_launch)
    calls = record_launches(monkeypatch, gluon_scores, "compressed_scores_gluon")
    chunks = []
    rank = topn_module.block_topn
    monkeypatch.setattr(topn_module, "block_topn",
                        lambda sc, idx, t0, *args: chunks.append((t0, sc.clone())) or rank(sc, idx, t0, *args))
    config = NSAConfig(**geometry)
    nc = config.num_cmp(q_offset + T)
    q = torch.randn(B, T, HQ, 128, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(B, nc, H, 128, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    scale = config.softmax_scale(128)
    kwargs = dict(score_buffer_bytes=chunk_bytes) if chunk_bytes else {}
    out, masses = {}, {}
    for flag in ("0", "1"):
        monkeypatch.setenv("NSA_GLUON_COMPRESSED_SCORES", flag)
        chunks.clear()
        out[flag] = compressed_fwd(q, k, v, config, scale, q_offset, select=True, **kwargs)
        masses[flag] = _scores_read(chunks, B, H, q_offset, config.sel_block)
    n_chunks = len(chunks)
    assert len(calls) == n_chunks and (n_chunks > 1) == (chunk_bytes is not None)
    (o, lse, idx), (o_want, lse_want, idx_want) = out["1"], out["0"]
    assert torch.equal(o, o_want) and torch.equal(lse, lse_want)
    assert torch.isfinite(masses["1"]).all()
    assert_close("block masses, Gluon scoring pass against Triton's", masses["1"], masses["0"], 1e-5)
    agree = (idx == idx_want).float().mean().item()
    assert agree > 0.999, f"the selections agree on {agree:.4%} of their entries"
