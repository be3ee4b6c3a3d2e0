"""Graph-safe decode: the static NSACache path, device-side emission, and CUDA-graph replay.

On CPU the static path runs through the reference decode (float64, exact to
rounding) and, under the interpreter, through the Triton decode. The ``gpu``
tests capture a decode step in a CUDA graph (a capture fails on any host sync,
so capturing is the sync-free check), replay it and compare every step with an
eager static step and with the reference prefill, outputs and blocks.
"""

from __future__ import annotations

import pytest
import torch

from nsa import NSAAttention, NSAConfig
from nsa.modules.graph import DecodeGraph
from nsa.ops.varlen import cu_seqlens_of
from nsa.testing import SELECTION_EPS, assert_close, assert_valid_selection, block_scores, nsa_attention_with_blocks

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)


def _layer(compression="mlp", dtype=torch.float64, device="cpu", config=SMALL, heads=(4, 2), dims=(8, 6), hidden=24):
    torch.manual_seed(1)
    layer = NSAAttention(hidden, heads[0], heads[1], dims[0], dims[1], config, compression=compression)
    return layer.to(device=device, dtype=dtype)


def _run(layer, cache, x, bounds, start=0):
    """Feed ``x[:, a:b]`` for consecutive bounds from ``start``; outputs and selected blocks, concatenated."""
    outs, blocks = [], []
    with torch.no_grad():
        for end in bounds:
            outs.append(layer(x[:, start:end], cache))
            blocks.append(cache.last_block_idx.clone())
            start = end
    return torch.cat(outs, 1), torch.cat(blocks, 1)


@pytest.mark.parity
@pytest.mark.parametrize(
    "compression, prefill, step",
    [
        pytest.param("mlp", 0, 1, id="mlp-decode-only"),
        pytest.param("mean", 8, 1, id="mean-prefill-selblock"),
        pytest.param("mlp", 13, 3, id="mlp-prefill13-step3"),
        pytest.param("mean", 7, 16, id="mean-prefill7-step16"),
    ],
)
def test_static_cache_decode_equals_prefill(compression, prefill, step):
    layer = _layer(compression)
    x = torch.randn(2, 41, 24, dtype=torch.float64)
    full_cache = layer.new_cache(2)
    with torch.no_grad():
        full = layer(x, full_cache)
    cache = layer.new_cache(2, capacity=44, static=True)
    pointer = cache.buffer("k_slc").data_ptr()
    bounds = ([prefill] if prefill else []) + list(range(prefill + step, 41, step)) + [41]
    out, blocks = _run(layer, cache, x, bounds)
    assert (out - full).abs().max() < 1e-12
    assert torch.equal(blocks, full_cache.last_block_idx)
    assert cache.length == 41 and cache.num_cmp == SMALL.num_cmp(41) and cache.seq_lens.tolist() == [41, 41]
    assert cache.buffer("k_slc").data_ptr() == pointer, "a static cache must never reallocate"
    assert (cache.view("k_cmp") - full_cache.view("k_cmp")).abs().max() < 1e-12


@pytest.mark.triton
@pytest.mark.parity
def test_static_cache_triton_decode_steps(nsa_device, nsa_tolerance):
    """Prefill eagerly, then decode steps through the Triton decode kernel."""
    layer = _layer("mlp", torch.float32, nsa_device, heads=(4, 1), dims=(16, 16))
    x = torch.randn(1, 41, 24, device=nsa_device)
    full_cache = layer.new_cache(1)
    with torch.no_grad():
        full = layer(x, full_cache)
    cache = layer.new_cache(1, capacity=48, static=True)
    layer.backend = None
    _run(layer, cache, x, [33])
    layer.backend = "triton"
    out, blocks = _run(layer, cache, x, [34, 35, 36, 38, 41], start=33)
    assert_close("o", out, full[:, 33:], nsa_tolerance(torch.float32))
    assert torch.equal(blocks, full_cache.last_block_idx[:, 33:])


@pytest.mark.parity
@pytest.mark.parametrize("compression", ["mlp", "mean"])
def test_prompts_of_different_lengths_then_decode_steps(compression):
    """A pack of prompts (5 shorter than a compressed block, 64 a whole number of selection
    blocks) fills an empty static cache row by row; decode steps then continue every row from
    its own length. Outputs, blocks and token reads equal each sequence run alone in its own
    cache, to rounding; the shorter rows' compressed tokens equal their own."""
    layer = _layer(compression)
    lengths, steps = [37, 5, 64, 20], [1, 3, 1]
    x = torch.randn(1, sum(lengths), 24, dtype=torch.float64)
    tails = torch.randn(len(lengths), sum(steps), 24, dtype=torch.float64)
    cu = cu_seqlens_of(lengths)
    cache = layer.new_cache(len(lengths), capacity=72, static=True)
    with torch.no_grad():
        out = layer(x, cache, cu_seqlens=cu)
        assert cache.ragged and cache.length == 64 and cache.seq_lens.tolist() == lengths
        outs, blocks, reads, start = [], [], [], 0
        for step in steps:
            outs.append(layer(tails[:, start : start + step], cache))
            blocks.append(cache.last_block_idx.clone())
            reads.append(cache.last_reads)
            start += step
    assert cache.seq_lens.tolist() == [n + sum(steps) for n in lengths]
    for i, n in enumerate(lengths):
        alone = layer.new_cache(1, capacity=72, static=True)
        seq = torch.cat([x[:, cu[i] : cu[i + 1]], tails[i : i + 1]], 1)
        with torch.no_grad():
            prompt = layer(seq[:, :n], alone)
            torch.testing.assert_close(out[:, cu[i] : cu[i + 1]], prompt, rtol=1e-12, atol=1e-12)
            start = n
            for step, o, b, r in zip(steps, outs, blocks, reads):
                o_i = layer(seq[:, start : start + step], alone)
                torch.testing.assert_close(o[i : i + 1], o_i, rtol=1e-12, atol=1e-12)
                assert torch.equal(b[i : i + 1], alone.last_block_idx)
                assert torch.equal(r.cmp[i], alone.last_reads.cmp[0]) and torch.equal(r.win[i], alone.last_reads.win[0])
                assert torch.equal(r.slc[i], alone.last_reads.slc[0])
                start += step
        emitted = SMALL.num_cmp(n + sum(steps))
        torch.testing.assert_close(cache.buffer("k_cmp")[i, :emitted], alone.buffer("k_cmp")[0, :emitted],
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.triton
@pytest.mark.parity
def test_prompts_of_different_lengths_triton_decode_steps(nsa_device, nsa_tolerance):
    """The same through the Triton decode kernel (the prompts by the default route)."""
    layer = _layer("mlp", torch.float32, nsa_device, heads=(4, 1), dims=(16, 16))
    lengths = [30, 9, 41]
    x = torch.randn(1, sum(lengths), 24, device=nsa_device)
    tails = torch.randn(len(lengths), 2, 24, device=nsa_device)
    cu = cu_seqlens_of(lengths)
    cache = layer.new_cache(len(lengths), capacity=48, static=True)
    with torch.no_grad():
        layer(x, cache, cu_seqlens=cu)
        layer.backend = "triton"
        out = torch.cat([layer(tails[:, :1], cache), layer(tails[:, 1:], cache)], 1)
        layer.backend = None
        for i, n in enumerate(lengths):
            alone = layer.new_cache(1)
            seq = torch.cat([x[:, cu[i] : cu[i + 1]], tails[i : i + 1]], 1)
            full = layer(seq, alone)
            assert_close("o", out[i : i + 1], full[:, n:], nsa_tolerance(torch.float32))
            assert torch.equal(cache.last_block_idx[i : i + 1], alone.last_block_idx[:, -1:])


def test_reset_cache_serves_new_prompts_as_a_new_cache():
    """A static cache emptied by ``reset`` (its buffers kept in place) gives the next prompts and
    steps the same outputs as a new cache, bitwise, and its buffers hold zeros again."""
    layer = _layer("mlp")
    cache = layer.new_cache(2, capacity=72, static=True)
    pointer = cache.buffer("k_slc").data_ptr()
    with torch.no_grad():
        layer(torch.randn(1, 130, 24, dtype=torch.float64), cache, cu_seqlens=torch.tensor([0, 70, 130]))
        layer(torch.randn(2, 1, 24, dtype=torch.float64), cache)
        cache.reset()
        assert cache.length == 0 and not cache.ragged and cache.seq_lens.tolist() == [0, 0]
        assert all(not cache.buffer(name).any() for name in ("k_slc", "v_win", "k_cmp_raw", "v_cmp"))
        x, tail, cu = torch.randn(1, 50, 24, dtype=torch.float64), torch.randn(2, 3, 24, dtype=torch.float64), torch.tensor([0, 13, 50])
        fresh = layer.new_cache(2, capacity=72, static=True)
        for c in (cache, fresh):
            c.outputs = [layer(x, c, cu_seqlens=cu)] + [layer(tail[:, t : t + 1], c) for t in range(3)]
    for a, b in zip(cache.outputs, fresh.outputs):
        assert torch.equal(a, b)
    with torch.no_grad():  # again, prompts of one length (the host path, then a device step)
        cache.reset()
        fresh = layer.new_cache(2, capacity=72, static=True)
        for c in (cache, fresh):
            c.outputs = [layer(x[:, :20].expand(2, 20, 24), c), layer(tail[:, :1], c)]
    for a, b in zip(cache.outputs, fresh.outputs):
        assert torch.equal(a, b)
    assert cache.seq_lens.tolist() == [21, 21] and cache.buffer("k_slc").data_ptr() == pointer


def test_prompts_of_different_lengths_need_an_empty_static_cache():
    layer = _layer("mean")
    x = torch.randn(1, 10, 24, dtype=torch.float64)
    cu = torch.tensor([0, 4, 10])
    with torch.no_grad():
        with pytest.raises(ValueError, match="empty static cache .* a growing cache holding 0 positions"):
            layer(x, layer.new_cache(2), cu_seqlens=cu)
        used = layer.new_cache(2, capacity=16, static=True)
        layer(torch.randn(2, 3, 24, dtype=torch.float64), used)
        with pytest.raises(ValueError, match="a static cache holding 3 positions"):
            layer(x, used, cu_seqlens=cu)
        with pytest.raises(ValueError, match="the pack holds 2 sequences; the cache was made for 3"):
            layer(x, layer.new_cache(3, capacity=16, static=True), cu_seqlens=cu)
        with pytest.raises(ValueError, match="static NSACache is full: 0 \\+ 6 positions exceed capacity 5"):
            layer(x, layer.new_cache(2, capacity=5, static=True), cu_seqlens=cu)
        ragged = layer.new_cache(2, capacity=40, static=True)
        layer(x, ragged, cu_seqlens=cu)
        with pytest.raises(ValueError, match="holds sequences of different lengths"):
            layer(torch.randn(2, 17, 24, dtype=torch.float64), ragged)  # past DEVICE_STEP_MAX_TOKENS


def test_static_cache_limits():
    layer = _layer()
    with pytest.raises(ValueError, match="capacity"):
        layer.new_cache(1, static=True)
    cache = layer.new_cache(1, capacity=10, static=True)
    with torch.no_grad():
        layer(torch.randn(1, 9, 24, dtype=torch.float64), cache)
        with pytest.raises(ValueError, match="static NSACache is full"):
            layer(torch.randn(1, 2, 24, dtype=torch.float64), cache)
        with pytest.raises(ValueError, match="static NSACache is full"):
            layer(torch.randn(1, 20, 24, dtype=torch.float64), layer.new_cache(1, capacity=10, static=True))
    with pytest.raises(ValueError, match="static NSACache on CUDA"):
        DecodeGraph(layer, layer.new_cache(1))


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parity
def test_decode_graph_replay_matches_eager_and_reference(nsa_device):
    """bf16, paper geometry: prefill 1000, then 80 captured steps across a selection-block
    boundary (1024) and several emissions; each step equals an eager static step, and
    the reference prefill (float32 compute on the same bf16 layer), given the step's blocks, to
    1e-2; the blocks are the reference's but for near-ties."""
    config, B, prefill, steps = NSAConfig(), 2, 1000, 80
    layer = _layer("mlp", torch.bfloat16, nsa_device, config, heads=(16, 4), dims=(64, 64), hidden=256)
    x = torch.randn(B, prefill + steps, 256, device=nsa_device, dtype=torch.bfloat16)
    graph_cache, eager_cache = (layer.new_cache(B, capacity=prefill + steps, static=True) for _ in range(2))
    with torch.no_grad():
        layer.backend = "reference"  # the prefill only fills the caches; its attention is not under test
        layer(x[:, :prefill], graph_cache)
        layer(x[:, :prefill], eager_cache)
        layer.backend = None
        step = DecodeGraph(layer, graph_cache)
        torch.cuda.set_sync_debug_mode("error")  # an eager static step must not sync either
        try:
            eager_first = layer(x[:, prefill : prefill + 1], eager_cache)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        outs, blocks = [step(x[:, prefill : prefill + 1]).clone()], [graph_cache.last_block_idx.clone()]
        eager_outs, eager_blocks = [eager_first], [eager_cache.last_block_idx.clone()]
        for t in range(prefill + 1, prefill + steps):
            outs.append(step(x[:, t : t + 1]).clone())
            blocks.append(graph_cache.last_block_idx.clone())
            eager_outs.append(layer(x[:, t : t + 1], eager_cache))
            eager_blocks.append(eager_cache.last_block_idx.clone())
        layer.backend = "reference"
        ref_cache = layer.new_cache(B)
        layer(x, ref_cache)
        # the reference's own attention inputs, to score blocks and to recompute given other blocks
        q, _, _, gates = layer._project(x, torch.arange(prefill + steps, device=nsa_device))
        q, gates = q[:, prefill:], gates[:, prefill:]
        kv = {name: ref_cache.view(name).float() for name in ("k_slc", "v_slc", "k_cmp", "v_cmp", "k_win", "v_win")}
        scores = block_scores(q, kv["k_cmp"], config, q_offset=prefill)
        graph_blocks = torch.cat(blocks, 1)
        ref_o = nsa_attention_with_blocks(q.float(), kv["k_slc"], kv["v_slc"], gates.float(), config, graph_blocks,
                                          kv_cmp=(kv["k_cmp"], kv["v_cmp"]), kv_win=(kv["k_win"], kv["v_win"]),
                                          q_offset=prefill)
        ref = layer.o_proj(ref_o.to(x.dtype).flatten(2))
    assert graph_cache.length == prefill + steps and graph_cache.seq_lens.tolist() == [prefill + steps] * B
    # graph and eager run the same kernels; cuBLAS may pick other GEMM kernels under capture (bf16
    # ulps), and the reference projects all positions at once: each step's blocks are a top-n of the
    # reference's scores, its own blocks but for near-ties
    ref_blocks = ref_cache.last_block_idx[:, prefill:]
    for got in (graph_blocks, torch.cat(eager_blocks, 1)):
        assert_valid_selection(got, ref_blocks, scores, config, q_offset=prefill, eps=SELECTION_EPS[x.dtype])
    assert_close("graph vs eager", torch.cat(outs, 1), torch.cat(eager_outs, 1), 1e-2)
    assert_close("o", torch.cat(outs, 1), ref, 1e-2)


@pytest.mark.gpu
@pytest.mark.triton
def test_decode_graph_replays_prompts_of_different_lengths(nsa_device):
    """Prompts of different lengths in one static cache, then CUDA-graph replays: every row's
    steps match the same steps of that sequence alone (eager, its own cache), bf16. After
    ``cache.reset()`` the same captured graph serves the next prompts."""
    config, steps = NSAConfig(), 24
    layer = _layer("mlp", torch.bfloat16, nsa_device, config, heads=(16, 4), dims=(64, 64), hidden=256)
    cache = layer.new_cache(3, capacity=1100, static=True)
    step = None
    for lengths in ([1000, 300, 777], [64, 1020, 5]):
        x = torch.randn(1, sum(lengths), 256, device=nsa_device, dtype=torch.bfloat16)
        tails = torch.randn(len(lengths), steps, 256, device=nsa_device, dtype=torch.bfloat16)
        cu = cu_seqlens_of(lengths)
        with torch.no_grad():
            cache.reset()
            layer(x, cache, cu_seqlens=cu)
            step = step or DecodeGraph(layer, cache)
            outs = torch.cat([step(tails[:, t : t + 1]).clone() for t in range(steps)], 1)
            assert cache.seq_lens.tolist() == [n + steps for n in lengths]
            for i, n in enumerate(lengths):
                alone = layer.new_cache(1, capacity=1100, static=True)
                layer(x[:, cu[i] : cu[i + 1]], alone)
                mine = torch.cat([layer(tails[i : i + 1, t : t + 1], alone) for t in range(steps)], 1)
                assert_close(f"{lengths}, sequence {i}", outs[i : i + 1], mine, 1e-2)
