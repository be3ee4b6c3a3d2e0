"""NSACache: chunked growth in place, the emission schedule, token-read counters."""

from __future__ import annotations

import copy

import pytest
import torch

from nsa import NSACache, NSAConfig
from nsa.modules.cache import RAW_BUFFERS, count_reads
from nsa.routing import TRITON_MISSING

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)


def _raw(B: int, T: int, H: int = 2, D: int = 4):
    return {name: torch.randn(B, T, H, D) for name in RAW_BUFFERS}


def _route_twins(batch: int, capacity: int, device: torch.device):
    """Two equal static caches, ``{"triton": ..., "reference": ...}``, their buffers filled with the
    same random values (so that a stray write shows), and their dtype (bf16 on a GPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    caches = {route: NSACache(SMALL, batch, 2, 8, 4, capacity=capacity, static=True, device=device, dtype=dtype)
              for route in ("triton", "reference")}  # fmt: skip
    for name in caches["triton"]._buf:
        filler = torch.randn_like(caches["triton"].buffer(name))
        for cache in caches.values():
            cache.buffer(name).copy_(filler)
    return caches, dtype


def _launches(monkeypatch, *names: str) -> list:
    """The names of :mod:`nsa.ops.decode.cache_write`'s functions ``names`` as they are called."""
    import nsa.ops.decode.cache_write as cache_write

    calls = []
    for name in names:
        real = getattr(cache_write, name)
        monkeypatch.setattr(cache_write, name, lambda *a, _real=real, _name=name: (calls.append(_name), _real(*a))[1])
    return calls


def _assert_same_buffers(caches) -> None:
    for name in caches["triton"]._buf:
        assert torch.equal(caches["triton"].buffer(name), caches["reference"].buffer(name)), name


def test_grows_by_whole_chunks_and_keeps_data() -> None:
    cache = NSACache(SMALL, 2, 2, 4, chunk=8)
    assert cache.capacity == 8
    written = []
    for step in (3, 1, 5, 1, 1, 9):
        raw = _raw(2, step)
        written.append(raw["k_slc"])
        cache.append(**raw)
        assert cache.capacity % 8 == 0 and cache.capacity >= cache.length
    assert cache.length == 20 and cache.capacity == 24
    assert torch.equal(cache.view("k_slc"), torch.cat(written, 1))


def test_append_in_place_without_reallocation_within_capacity() -> None:
    cache = NSACache(SMALL, 1, 2, 4, capacity=64, chunk=8)
    cache.append(**_raw(1, 1))
    pointer = cache.view("k_slc").data_ptr()
    for _ in range(63):
        cache.append(**_raw(1, 1))
    assert cache.view("k_slc").data_ptr() == pointer and cache.capacity == 64


def test_pending_compressed_tokens_follow_absolute_schedule() -> None:
    cache = NSACache(SMALL, 1, 2, 4, chunk=8)
    emitted = []
    for step in (5, 2, 1, 3, 1, 4):
        cache.append(**_raw(1, step))
        emitted.append(cache.pending_cmp())
        cache.append_compressed(torch.randn(1, emitted[-1], 2, 4), torch.randn(1, emitted[-1], 2, 4))
    # token i covers positions [4i, 4i + 8): it is complete once length >= 4i + 8, i.e. at
    # lengths 8, 12, 16; the cache lengths after each append are 5, 7, 8, 11, 12, 16
    assert emitted == [0, 0, 1, 0, 1, 1]
    assert cache.num_cmp == SMALL.num_cmp(16)


def test_cache_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        NSACache(SMALL, 0, 2, 4)
    cache = NSACache(SMALL, 1, 2, 4)
    with pytest.raises(ValueError, match="needs exactly"):
        cache.append(k_slc=torch.randn(1, 1, 2, 4))


def test_token_reads_from_real_blocks() -> None:
    # query at t = 21 (block 2 holds positions 16..21 so far): blocks 0 and 2 -> 8 + 6 reads
    block_idx = torch.tensor([[[[0, 2, -1, -1], [0, 1, 2, -1]]]], dtype=torch.int32)  # [B=1, T=1, H=2, 4]
    reads = count_reads(block_idx, 21, SMALL)
    assert reads.slc.tolist() == [[[14, 22]]]
    assert reads.cmp.tolist() == [SMALL.num_cmp(22)] and reads.win.tolist() == [16]
    assert reads.last_step() == {"cmp": 4.0, "slc": 18.0, "win": 16.0, "total": 38.0}


@pytest.mark.parametrize("context, expected", [(8192, 2047), (16384, 2559), (32768, 3583), (65536, 5631)])
def test_paper_table4_read_counts(context: int, expected: int) -> None:
    config = NSAConfig()
    assert config.decode_reads(context) == expected
    # the same figure from a real selection: n full blocks for the last query at context - 1
    blocks = torch.arange(context // config.sel_block - config.sel_count, context // config.sel_block)
    reads = count_reads(blocks.view(1, 1, 1, -1).to(torch.int32), context - 1, config)
    assert int(reads.cmp[0] + reads.slc[0, 0, 0] + reads.win[0]) == expected


def test_decode_steps_count_reads_only_when_asked(monkeypatch) -> None:
    """A layer's steps keep their selection and positions but compute no reads (ten small kernels
    a step, captured into every ``DecodeGraph`` replay before); ``last_reads`` computes them when
    read, equal to ``count_reads`` of the step's blocks at its positions, and is None again after
    ``reset``."""
    import nsa.modules.cache as cache_module
    from nsa import NSAAttention

    calls = []
    real = cache_module.count_reads
    monkeypatch.setattr(cache_module, "count_reads", lambda *a: (calls.append(a), real(*a))[1])
    torch.manual_seed(0)
    layer = NSAAttention(24, 4, 2, 8, config=SMALL).double()
    cache = layer.new_cache(2, capacity=48, static=True)
    x = torch.randn(2, 44, 24, dtype=torch.float64)
    with torch.no_grad():
        layer(x[:, :40], cache)
        for t in range(40, 44):
            layer(x[:, t : t + 1], cache)
    assert calls == []
    reads = cache.last_reads
    want = real(cache.last_block_idx, torch.full((2, 1), 43), SMALL)
    assert all(torch.equal(getattr(reads, f), getattr(want, f)) for f in ("cmp", "slc", "win"))
    assert reads.last_step()["win"] == SMALL.window and len(calls) == 1
    cache.reset()
    assert cache.last_reads is None and cache.last_block_idx is None


@pytest.mark.triton
@pytest.mark.parametrize("views", [False, True], ids=["contiguous", "views-of-one-product"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_one_launch_write_equals_the_six_assignments(tokens, views, nsa_device, monkeypatch) -> None:
    """``NSACache.write`` on the Triton route (one launch, :mod:`nsa.ops.decode.cache_write`) leaves
    every buffer bit for bit as the six assignments of the reference route do: rows of a batch at
    different positions, keys and values of different widths, contiguous or slices of one wider
    tensor (as a layer's decode step passes its values), buffers filled with random values
    beforehand so that a stray write shows; and advances each row's ``seq_lens`` by the tokens
    written, as the reference route's addition does (the launch does it too)."""
    launches = _launches(monkeypatch, "write_rows")
    torch.manual_seed(0)
    caches, dtype = _route_twins(3, 40, nsa_device)
    for cache in caches.values():
        cache.seq_lens.copy_(torch.tensor([5, 17, 30]))
    positions = torch.tensor([[5], [17], [30]], device=nsa_device) + torch.arange(tokens, device=nsa_device)
    widths = [2 * (4 if name[0] == "v" else 8) for name in RAW_BUFFERS]
    if views:  # one product [3, tokens, 72 + 5], each tensor a slice of its rows
        product = torch.randn(3, tokens, sum(widths) + 5, device=nsa_device, dtype=dtype)
        parts = torch.split(product[..., 5:], widths, dim=-1)
        raw = {name: part.unflatten(-1, (2, -1)) for name, part in zip(RAW_BUFFERS, parts)}
        assert not raw["v_win"].is_contiguous()
    else:
        raw = {name: torch.randn(3, tokens, 2, w // 2, device=nsa_device, dtype=dtype)
               for name, w in zip(RAW_BUFFERS, widths)}  # fmt: skip
    for route, cache in caches.items():
        cache.write(positions, backend=route, **raw)
    assert launches == ["write_rows"]
    _assert_same_buffers(caches)
    want_lens = [5 + tokens, 17 + tokens, 30 + tokens]
    assert caches["triton"].seq_lens.tolist() == caches["reference"].seq_lens.tolist() == want_lens
    for name in ("k_slc", "v_cmp_raw"):  # and the values did land where asked
        assert torch.equal(caches["triton"].buffer(name)[1, 17 : 17 + tokens], raw[name][1])


def test_write_refuses_a_value_of_another_shape_or_dtype() -> None:
    cache = NSACache(SMALL, 1, 2, 8, 4, capacity=16, static=True)
    raw = {name: torch.randn(1, 1, 2, 4 if name[0] == "v" else 8) for name in RAW_BUFFERS}
    positions = torch.zeros(1, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"v_win must be torch.float32 \[1, 1, 2, 4\], got torch.float32 \[1, 1, 2, 8\]"):
        cache.write(positions, **{**raw, "v_win": torch.randn(1, 1, 2, 8)})
    with pytest.raises(ValueError, match=r"k_slc must be torch.float32 .* got torch.float64"):
        cache.write(positions, **{**raw, "k_slc": raw["k_slc"].double()})


@pytest.mark.triton
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("capacity, last", [(40, [13, 5, 39, 26]), (6, [3, 5, 0, 2])], ids=["long", "shorter-than-a-block"])
def test_two_launch_emission_equals_the_indexing(count, capacity, last, nsa_device, monkeypatch) -> None:
    """``NSACache.emit`` on the Triton route (the blocks gathered in one launch, the tokens stored
    in another) leaves every buffer bit for bit as the indexing of the reference route does: rows
    whose newest token is complete, not complete yet (slot 0), at the end of the capacity, and in
    a cache shorter than one block (an incomplete block's positions clamped to its end); buffers
    filled with random values so that a stray write shows."""
    launches = _launches(monkeypatch, "gather_cmp_blocks", "write_rows")
    torch.manual_seed(1)
    caches, dtype = _route_twins(4, capacity, nsa_device)
    weight = torch.randn(SMALL.cmp_block, device=nsa_device, dtype=dtype)

    def phi(blocks):  # [N, l, H, D] -> [N, 1, H, D]: position-aware, summed in one order whatever the layout
        return sum(blocks[:, j : j + 1] * weight[j] for j in range(SMALL.cmp_block))

    last = torch.tensor(last, device=nsa_device)  # (long) complete, not complete (l = 8), the capacity's end
    for route, cache in caches.items():
        cache.emit(last, count, phi, phi, backend=route)
    assert launches == ["gather_cmp_blocks", "write_rows"]
    _assert_same_buffers(caches)
    if capacity == 40:  # and the newest token is the one its rule names: raw positions 4 * 1 ... 4 * 1 + 7 of row 0
        raw = caches["triton"].buffer("k_cmp_raw")[0, 4:12]
        assert torch.equal(caches["triton"].buffer("k_cmp")[0, 1], phi(raw[None])[0, 0])


def test_write_rows_takes_key_value_pairs_only() -> None:
    pytest.importorskip("triton", reason=TRITON_MISSING)
    from nsa.ops.decode.cache_write import write_rows

    buffers = [torch.zeros(1, 4, 2, 8)] * 3
    with pytest.raises(ValueError, match="1-3 key/value pairs, got 3 buffers and 3 values"):
        write_rows(buffers, buffers, torch.zeros(1, 1, dtype=torch.int64))


def _mlp_pair(dtype: torch.dtype, device: torch.device):
    """Learnable compressions for the twins' keys (D 8, hidden 80: two chunks of 64 hidden units,
    the second partly masked) and values (D 4, hidden 6): unequal widths, as the launched
    emission's masks must handle."""
    from nsa.modules import MLPCompression

    torch.manual_seed(2)
    return [MLPCompression(D, SMALL, hidden=hidden).to(device=device, dtype=dtype) for D, hidden in ((8, 80), (4, 6))]


@pytest.mark.triton
@pytest.mark.parametrize("at_once", [True, False], ids=["splits-at-once", "split-by-split"])
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("capacity, last", [(40, [13, 5, 39, 26]), (6, [3, 5, 0, 2])], ids=["long", "shorter-than-a-block"])
def test_learnable_emission_in_launches_equals_the_modules(at_once, count, capacity, last, nsa_device,
                                                           monkeypatch) -> None:  # fmt: skip
    """With :class:`nsa.modules.MLPCompression` for keys and values and no gradient wanted,
    ``NSACache.emit`` on the Triton route makes the tokens in three launches
    (:mod:`nsa.ops.decode.mlp_emission`) and stores them where the indexing of the reference
    route, running the modules, does: the same slots and clamped positions as the gather, the
    same values up to the products' order of summation (float32 on the CPU, bf16 on a GPU), and
    every other element of every buffer untouched (random values beforehand)."""
    import nsa.ops.decode.mlp_emission as mlp_emission

    monkeypatch.setattr(mlp_emission, "SUM_AT_ONCE_MIN_ROWS", 0 if at_once else 10**9)  # the second launch's two ways
    launches = _launches(monkeypatch, "gather_cmp_blocks", "write_rows")
    real = mlp_emission.emit_mlp_tokens
    monkeypatch.setattr(mlp_emission, "emit_mlp_tokens", lambda *a: (launches.append("emit_mlp_tokens"), real(*a))[1])
    torch.manual_seed(1)
    caches, dtype = _route_twins(4, capacity, nsa_device)
    phi_k, phi_v = _mlp_pair(dtype, nsa_device)
    last = torch.tensor(last, device=nsa_device)
    with torch.no_grad():
        for route, cache in caches.items():
            cache.emit(last, count, phi_k, phi_v, backend=route)
    assert launches == ["emit_mlp_tokens"]
    for name in caches["triton"]._buf:
        got, want = caches["triton"].buffer(name), caches["reference"].buffer(name)
        if name in ("k_cmp", "v_cmp"):
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
            torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=name)
        else:
            assert torch.equal(got, want), name


def test_learnable_emission_takes_the_modules_where_the_launches_cannot(nsa_device, monkeypatch) -> None:
    """The launched emission stands in for the modules only where it computes what they do:
    no gradient wanted, the stock MLP (``Linear``, exact GELU, ``Linear``), parameters of the
    cache's dtype. Elsewhere ``emission_weights`` says no and the emission runs the modules."""
    phi_k, phi_v = _mlp_pair(torch.float32, torch.device("cpu"))
    assert phi_k.emission_weights(torch.float32) is None  # parameters that want a gradient
    with torch.no_grad():
        weights = phi_k.emission_weights(torch.float32)
        assert weights is not None and weights.w1 is phi_k.mlp[0].weight and weights.pos_emb is phi_k.pos_emb
        assert phi_k.emission_weights(torch.bfloat16) is None
        phi_v.mlp[1] = torch.nn.GELU(approximate="tanh")
        assert phi_v.emission_weights(torch.float32) is None
        phi_v.mlp = torch.nn.Sequential(*phi_k.mlp, torch.nn.Identity())
        assert phi_v.emission_weights(torch.float32) is None


def test_emit_mlp_tokens_names_a_bad_weight() -> None:
    pytest.importorskip("triton", reason=TRITON_MISSING)
    from nsa.ops.decode.mlp_emission import emit_mlp_tokens

    phi_k, phi_v = _mlp_pair(torch.float32, torch.device("cpu"))
    cache = NSACache(SMALL, 1, 2, 8, 4, capacity=16, static=True)
    with torch.no_grad():
        weights = [phi.emission_weights(torch.float32) for phi in (phi_k, phi_v)]
    bad = weights[1]._replace(w2=weights[1].w2.t().contiguous())
    buffers = [cache.buffer(name) for name in ("k_cmp_raw", "v_cmp_raw", "k_cmp", "v_cmp")]
    with pytest.raises(ValueError, match=r"weights\[1\].w2 must be a contiguous torch.float32 \[4, 6\] on cpu, got torch.float32 \[6, 4\]"):
        emit_mlp_tokens(*buffers, torch.tensor([9]), 1, SMALL, [weights[0], bad])


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_learnable_emission_at_the_benchmark_sizes_on_the_gpu(batch, nsa_device) -> None:
    """bf16, the paper's geometry (l 32, d 16), head dim 128, the default hidden width (256): the
    tokens made in three launches are as close to the modules run in float64 as the bf16 modules'
    own (within one more rounding), at sequences' last positions drawn over a 4k cache."""
    from nsa.modules import MLPCompression

    torch.manual_seed(3)
    config, H, D, capacity = NSAConfig(), 4, 128, 4096
    cache = NSACache(config, batch, H, D, capacity=capacity, static=True, device=nsa_device, dtype=torch.bfloat16)
    for name in cache._buf:
        cache.buffer(name).normal_()
    phis = [MLPCompression(D, config).to(nsa_device, torch.bfloat16) for _ in range(2)]
    last = torch.randint(config.cmp_block - 1, capacity, (batch,), device=nsa_device)
    with torch.no_grad():
        cache.emit(last, 1, *phis, backend="triton")
        slots = torch.div(last + 1 - config.cmp_block, config.cmp_stride, rounding_mode="floor")
        rows = torch.arange(batch, device=nsa_device)
        positions = slots[:, None] * config.cmp_stride + torch.arange(config.cmp_block, device=nsa_device)
        for raw, name, phi in zip(("k_cmp_raw", "v_cmp_raw"), ("k_cmp", "v_cmp"), phis):
            blocks = cache.buffer(raw)[rows[:, None], positions]  # [B, l, H, D]
            got = cache.buffer(name)[rows, slots].float()  # [B, H, D]
            bf16 = phi(blocks)[:, 0].float()
            exact = copy.deepcopy(phi).double()(blocks.double())[:, 0]
            err = lambda t: float((t - exact).abs().max() / exact.abs().max())  # noqa: E731
            assert err(got) <= 1.5 * err(bf16) + 1e-3, (name, err(got), err(bf16))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
def test_learnable_emission_pdl_changes_nothing_but_timing(batch, nsa_device) -> None:
    """Launches that start early (programmatic dependent launch) and load their parameters while
    the launch before runs store the very tokens of launches that start in turn, bit for bit, at
    the benchmark sizes, right after a cache write (as a decode step runs them)."""
    from nsa.modules import MLPCompression
    from nsa.ops._triton.device import pdl_supported
    from nsa.ops.decode.mlp_emission import emit_mlp_tokens

    if not pdl_supported(nsa_device):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 or later")
    torch.manual_seed(4)
    config, H, D = NSAConfig(), 4, 128
    cache = NSACache(config, batch, H, D, capacity=4096, static=True, device=nsa_device, dtype=torch.bfloat16)
    for name in cache._buf:
        cache.buffer(name).normal_()
    phis = [MLPCompression(D, config).to(nsa_device, torch.bfloat16) for _ in range(2)]
    cache.seq_lens.copy_(torch.randint(config.cmp_block, 4096 - 2, (batch,)))
    buffers = [cache.buffer(name) for name in ("k_cmp_raw", "v_cmp_raw", "k_cmp", "v_cmp")]
    positions = cache.positions(1)
    rows = torch.arange(batch, device=nsa_device)
    got = {}
    with torch.no_grad():
        weights = [phi.emission_weights(torch.bfloat16) for phi in phis]
        for pdl in (False, True, False):
            torch.manual_seed(5)  # the same new rows each time, over zeros: an emission that read early would differ
            raw = {name: torch.randn(batch, 1, H, D, device=nsa_device, dtype=torch.bfloat16) for name in RAW_BUFFERS}
            for name in ("k_cmp", "v_cmp"):
                cache.buffer(name).fill_(float("nan"))  # poisoned: every token must be stored again
            for name in ("k_cmp_raw", "v_cmp_raw"):
                cache.buffer(name)[rows, positions[:, -1]] = 0
            cache.write(positions, backend="triton", **raw)
            emit_mlp_tokens(*buffers, positions[:, -1], 1, config, weights, pdl=pdl)
            cache.seq_lens.sub_(1)
            got.setdefault(pdl, []).append([cache.buffer(n).clone() for n in ("k_cmp", "v_cmp")])
    slots = (positions[:, -1] + 1 - config.cmp_block) // config.cmp_stride
    for k_cmp, v_cmp in (*got[True], got[False][1]):
        for buffer, want in zip((k_cmp, v_cmp), got[False][0]):
            assert not torch.isnan(buffer[rows, slots]).any()
            assert torch.equal(buffer.nan_to_num(7.0), want.nan_to_num(7.0))


def test_learnable_emission_tiles_rows_by_the_gpus_shared_memory() -> None:
    """The first launch's programs take 64 rows only where their staged operands fit: 16-bit heads
    up to 128 wide on Hopper's shared memory (the CPU counts as Hopper); 16 on an RTX 4090, for
    heads of 192 (256 padded) and for float32."""
    pytest.importorskip("triton", reason=TRITON_MISSING)
    from nsa.ops._triton.device import sized_as
    from nsa.ops.decode.mlp_emission import row_tile

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert row_tile(64, 128, torch.bfloat16, cpu) == 64 and row_tile(200, 128, torch.float16, cpu) == 64
    assert row_tile(4, 128, torch.bfloat16, cpu) == 4
    assert row_tile(64, 256, torch.bfloat16, cpu) == 16 and row_tile(64, 128, torch.float32, cpu) == 16
    with sized_as("rtx4090"):
        assert row_tile(64, 128, torch.bfloat16, gpu) == 16
    with sized_as("h100"):  # launches sized for a GPU, whatever this machine has
        assert row_tile(64, 128, torch.bfloat16, gpu) == 64 and row_tile(4, 128, torch.bfloat16, gpu) == 16


def test_step_positions_are_int64_past_the_int32_lengths() -> None:
    """``positions(steps)``: each row's next positions from its device length, int64 even where
    they pass 2**31 - 1 (the int32 lengths promote in the addition); for a device step's tokens
    one op, the addition to offsets the cache made once (an arange and a cast made three), and
    for longer calls an arange too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from nsa.modules.cache import DEVICE_STEP_MAX_TOKENS

    cache = NSACache(SMALL, 3, 2, 8, 4, capacity=16, static=True)
    cache.seq_lens.copy_(torch.tensor([0, 7, 2**31 - 2], dtype=torch.int32))

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    for steps, launched in ((3, ["aten.add"]), (DEVICE_STEP_MAX_TOKENS, ["aten.add"]),
                            (DEVICE_STEP_MAX_TOKENS + 1, ["aten.arange", "aten.add"])):  # fmt: skip
        with Ops() as ops:
            got = cache.positions(steps)
        want = torch.tensor([0, 7, 2**31 - 2], dtype=torch.int64)[:, None] + torch.arange(steps)
        assert got.dtype == torch.int64 and torch.equal(got, want), steps
        assert [n for n in ops.names if n not in ("aten.slice", "aten.unsqueeze")] == launched, steps
