"""The spec's identities at the ops level (NSA_SPEC.md, "Identities every implementation must satisfy").

1. Full coverage: ``o_slc`` and ``o_win`` equal dense causal attention when they cover everything.
2. Causality: nothing at positions > t changes output t, its gradient, or the blocks chosen for t.
3. Decode = prefill: queries at ``q_offset = p`` over the history give the prefill's rows,
   for p on and off the ``cmp_stride`` / ``sel_block`` grid, in chunks and one token at a time.
4. float64 gradcheck of q, k, v, the compressed keys/values and the gates, through every op.

Besides, each branch is checked against an independent float64 oracle (``tests/_dense.py``),
and queries that see no compressed token never produce NaN.
"""

from __future__ import annotations

import math

import pytest
import torch
from _dense import attention, block_mask, cmp_visible, dense_causal, mean_pool

import nsa
from nsa import ops
from nsa.testing import assert_close, rel_error

# Small geometry with the default ratios (l = 2d, l' = 4d) so selection is sparse at T ~ 100.
SMALL = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)
# Stride 8 and block 16, so that the decode offsets 15/16/17, 63/64/65 straddle both grids.
DECODE = nsa.NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=32)


def _inputs(B, T, H, G, Dk, Dv, *, device="cpu", dtype=torch.float64, requires_grad=False):
    """Fresh random q, k, v and gates in (0, 1) for every branch."""
    q = torch.randn(B, T, H * G, Dk, device=device, dtype=dtype)
    k = torch.randn(B, T, H, Dk, device=device, dtype=dtype)
    v = torch.randn(B, T, H, Dv, device=device, dtype=dtype)
    gates = torch.rand(B, T, H * G, 3, device=device, dtype=dtype)
    return [x.requires_grad_(requires_grad) for x in (q, k, v, gates)]


SHAPES = [  # B, T, H, G, Dk, Dv
    pytest.param(2, 1, 2, 1, 8, 6, id="B2-T1-H2-G1-Dk8-Dv6"),
    pytest.param(2, 31, 2, 2, 8, 5, id="B2-T31-H2-G2-Dk8-Dv5"),
    pytest.param(2, 32, 1, 4, 6, 8, id="B2-T32-H1-G4-Dk6-Dv8"),
    pytest.param(2, 33, 1, 16, 8, 4, id="B2-T33-H1-G16-Dk8-Dv4"),
    pytest.param(2, 77, 2, 2, 4, 6, id="B2-T77-H2-G2-Dk4-Dv6"),
    pytest.param(2, 130, 2, 4, 8, 6, id="B2-T130-H2-G4-Dk8-Dv6"),
    pytest.param(2, 257, 1, 16, 8, 6, id="B2-T257-H1-G16-Dk8-Dv6"),
]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float64, id="fp64")]


def _check_dense(name, out, ref, dtype, nsa_tolerance):
    """Spec threshold for float32 (max abs error < 1e-5) and the profile's relative error for both."""
    assert out.shape == ref.shape and out.dtype == dtype
    if dtype == torch.float32:
        err = (out.double() - ref).abs().max().item()
        assert err < 1e-5, f"{name}: max abs error {err:.2e} >= 1e-5 against dense causal attention"
    assert_close(f"{name} against dense causal attention", out, ref, nsa_tolerance(dtype))


# ---------------------------------------------------------------- 1. full coverage


@pytest.mark.parity
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, T, H, G, Dk, Dv", SHAPES)
def test_full_coverage_selected_is_dense(B, T, H, G, Dk, Dv, dtype, nsa_device, nsa_tolerance):
    """With n * l' >= T every visible block is selected and o_slc is dense causal attention."""
    cfg = nsa.NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=max(3, -(-T // 16)), window=16)
    q, k, v, _ = _inputs(B, T, H, G, Dk, Dv, device=nsa_device, dtype=dtype)
    idx = ops.select_blocks(q, ops.mean_compress(k, cfg), cfg)
    own = torch.arange(T, device=idx.device) // cfg.sel_block  # [T]
    want = torch.arange(cfg.sel_count, device=idx.device)
    want = torch.where(want <= own[:, None], want, -1)  # all of 0..t//l', then -1
    assert torch.equal(idx, want[None, :, None, :].expand_as(idx).to(idx.dtype))
    out = ops.selected_attention(q, k, v, idx, cfg)
    _check_dense("o_slc", out, dense_causal(q, k, v), dtype, nsa_tolerance)


@pytest.mark.parity
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B, T, H, G, Dk, Dv", SHAPES)
def test_full_coverage_window_is_dense(B, T, H, G, Dk, Dv, dtype, nsa_device, nsa_tolerance):
    """With w >= T the sliding branch is dense causal attention (w = T and w = T + 5)."""
    q, k, v, _ = _inputs(B, T, H, G, Dk, Dv, device=nsa_device, dtype=dtype)
    ref = dense_causal(q, k, v)
    for window in (T, T + 5):
        cfg = nsa.NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=4, window=window)
        _check_dense(f"o_win (w={window})", ops.sliding_window_attention(q, k, v, cfg), ref, dtype, nsa_tolerance)


@pytest.mark.parity
@pytest.mark.parametrize("B, T, H, G, Dk, Dv", [SHAPES[2], SHAPES[5]])
def test_full_coverage_gated_sum(B, T, H, G, Dk, Dv, nsa_device, nsa_tolerance):
    """nsa_attention with full coverage and g_cmp = 0 is (g_slc + g_win) * dense causal attention."""
    cfg = nsa.NSAConfig(cmp_block=16, cmp_stride=8, sel_block=16, sel_count=max(3, -(-T // 16)), window=T)
    q, k, v, gates = _inputs(B, T, H, G, Dk, Dv, device=nsa_device, dtype=torch.float32)
    gates[..., 0] = 0
    out = ops.nsa_attention(q, k, v, gates, cfg)
    ref = gates[..., 1:].sum(-1, keepdim=True).double() * dense_causal(q, k, v)
    _check_dense("o", out, ref, torch.float32, nsa_tolerance)


# ---------------------------------------------------------------- each branch against an oracle


@pytest.mark.parity
@pytest.mark.parametrize("B, T, H, G, Dk, Dv", SHAPES[1:])
def test_branches_match_masked_dense_oracle(B, T, H, G, Dk, Dv, nsa_device, nsa_tolerance):
    """Each branch at sparse settings equals float64 attention under the spec's mask."""
    cfg, dtype = SMALL, torch.float32
    q, k, v, gates = _inputs(B, T, H, G, Dk, Dv, device=nsa_device, dtype=dtype)
    tol = nsa_tolerance(dtype)
    k_cmp, v_cmp = ops.mean_compress(k, cfg), ops.mean_compress(v, cfg)
    assert_close("k_cmp", k_cmp, mean_pool(k, cfg), tol)
    assert_close("v_cmp", v_cmp, mean_pool(v, cfg), tol)
    o_cmp, lse = ops.compressed_attention(q, k_cmp, v_cmp, cfg)
    seen = cmp_visible(T, k_cmp.shape[1], cfg, device=q.device)
    assert_close("o_cmp", o_cmp, attention(q, k_cmp, v_cmp, seen), tol)
    logits = torch.einsum("bthd,bihd->bthi", q.double(), k_cmp.double().repeat_interleave(G, 2)) / math.sqrt(Dk)
    lse_ref = logits.masked_fill(~seen[None, :, None, :], float("-inf")).logsumexp(-1)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)) and (lse[torch.isinf(lse)] < 0).all()
    finite = torch.isfinite(lse_ref)
    assert_close("lse", lse[finite], lse_ref[finite], tol)
    idx = ops.select_blocks(q, k_cmp, cfg)
    o_slc = ops.selected_attention(q, k, v, idx, cfg)
    assert_close("o_slc", o_slc, attention(q, k, v, block_mask(idx, T, cfg, G)), tol)
    o_win = ops.sliding_window_attention(q, k, v, cfg)
    assert_close("o_win", o_win, dense_causal(q, k, v, window=cfg.window), tol)
    out = ops.nsa_attention(q, k, v, gates, cfg)
    ref = ops.combine_branches(gates.double(), o_cmp.double(), o_slc.double(), o_win.double())
    assert_close("o", out, ref, tol)


def test_selected_attention_takes_any_block_list():
    """Unsorted lists, repeats (counted once), -1 padding and blocks past t follow the mask oracle."""
    B, T, H, G = 2, 45, 2, 2
    q, k, v, _ = _inputs(B, T, H, G, 6, 4)
    idx = torch.randint(-1, SMALL.num_sel_blocks(T), (B, T, H, 5), dtype=torch.int32)
    idx[:, :, 0, 1] = idx[:, :, 0, 0]  # a repeat in every row of head 0
    idx[:, 10:, 1, :] = -1  # no block at all: the row is 0
    out = ops.selected_attention(q, k, v, idx, SMALL)
    assert rel_error(out, attention(q, k, v, block_mask(idx, T, SMALL, G))) <= 1e-12
    assert torch.equal(out[:, 10:, G:], torch.zeros_like(out[:, 10:, G:]))


# ---------------------------------------------------------------- 2. causality


@pytest.mark.parametrize("cut", [1, 8, 31, 40, 76])
def test_causality(cut, nsa_device, nsa_tolerance):
    """New q/k/v/gates at positions >= cut change neither the outputs, the gradients nor the
    blocks of positions < cut; the gradient of outputs < cut w.r.t. inputs >= cut is exactly 0."""
    cfg, dtype = SMALL, torch.float32
    a = _inputs(2, 77, 2, 2, 8, 6, device=nsa_device, dtype=dtype, requires_grad=True)
    fresh = [torch.randn_like(x[:, cut:]) for x in a[:3]] + [torch.rand_like(a[3][:, cut:])]
    b = [torch.cat([x.detach()[:, :cut], y], 1).requires_grad_() for x, y in zip(a, fresh)]
    outs, idxs = [], []
    for q, k, v, gates in (a, b):
        out, idx = ops.nsa_attention(q, k, v, gates, cfg, return_block_idx=True)
        out[:, :cut].sum().backward()
        idxs.append(idx)
        outs.append(out.detach())
    assert torch.equal(idxs[0][:, :cut], idxs[1][:, :cut])
    assert_close(f"o before {cut}", outs[1][:, :cut], outs[0][:, :cut], nsa_tolerance(dtype))
    assert rel_error(outs[1][:, cut:], outs[0][:, cut:]) > 1e-2  # the perturbation is real
    for name, xa, xb in zip(("q", "k", "v", "gates"), a, b):
        assert torch.count_nonzero(xa.grad[:, cut:]) == 0, f"d out[<{cut}] / d {name}[>={cut}] != 0"
        assert_close(f"d{name} before {cut}", xb.grad[:, :cut], xa.grad[:, :cut], nsa_tolerance(dtype, "grad"))
        # (position 0 attends only to itself: its output depends on neither q nor k)
        assert torch.count_nonzero(xa.grad[:, :cut]) > 0 or (cut == 1 and name in "qk"), name


# ---------------------------------------------------------------- 3. decode = prefill


def _prefill(q, k, v, gates, cfg):
    return ops.nsa_attention(q, k, v, gates, cfg, return_block_idx=True)


def _step(q, k, v, gates, cfg, p, tq, keys):
    """Queries p .. p+tq-1 at q_offset = p over ``keys`` positions of k/v (and their compression)."""
    kh, vh = k[:, :keys], v[:, :keys]
    kv_cmp = (ops.mean_compress(kh, cfg), ops.mean_compress(vh, cfg))
    sl = slice(p, p + tq)
    return ops.nsa_attention(q[:, sl], kh, vh, gates[:, sl], cfg, kv_cmp=kv_cmp, q_offset=p, return_block_idx=True)


@pytest.mark.parity
@pytest.mark.parametrize("tq", [1, 7])
@pytest.mark.parametrize("p", [0, 1, 15, 16, 17, 24, 63, 64, 65, 100])
def test_decode_equals_prefill(p, tq, nsa_device, nsa_tolerance):
    """Queries at q_offset = p over the exact history equal the prefill's rows p .. p+tq-1."""
    cfg, dtype, T = DECODE, torch.float32, 130
    q, k, v, gates = _inputs(2, T, 2, 2, 8, 6, device=nsa_device, dtype=dtype)
    ref, ref_idx = _prefill(q, k, v, gates, cfg)
    out, idx = _step(q, k, v, gates, cfg, p, tq, keys=p + tq)
    assert torch.equal(idx, ref_idx[:, p : p + tq])
    assert_close("o", out, ref[:, p : p + tq], nsa_tolerance(dtype))


@pytest.mark.parity
@pytest.mark.parametrize("p", [15, 16, 17, 63, 64, 65])
def test_decode_after_prefill_in_a_cache_buffer(p, nsa_device, nsa_tolerance):
    """Prefill p tokens, then decode one token at a time with keys in a whole buffer whose
    unwritten tail is NaN (as in a preallocated cache): rows equal the prefill's."""
    cfg, dtype, T, steps = DECODE, torch.float32, 96, 9
    q, k, v, gates = _inputs(2, T, 2, 2, 8, 6, device=nsa_device, dtype=dtype)
    ref, ref_idx = _prefill(q, k, v, gates, cfg)
    outs, idxs = [], []
    for t in range(p, p + steps):
        k_buf, v_buf = k.clone(), v.clone()
        k_buf[:, t + 1 :] = float("nan")
        v_buf[:, t + 1 :] = float("nan")
        kv_cmp = (ops.mean_compress(k_buf, cfg), ops.mean_compress(v_buf, cfg))
        args = (q[:, t : t + 1], k_buf, v_buf, gates[:, t : t + 1], cfg)
        out, idx = ops.nsa_attention(*args, kv_cmp=kv_cmp, q_offset=t, return_block_idx=True)
        outs.append(out)
        idxs.append(idx)
    assert torch.equal(torch.cat(idxs, 1), ref_idx[:, p : p + steps])
    assert_close("o", torch.cat(outs, 1), ref[:, p : p + steps], nsa_tolerance(dtype))


# ---------------------------------------------------------------- 4. gradients


GRAD_CFG = SMALL


@pytest.fixture
def one_thread():
    """gradcheck makes hundreds of tiny calls: intra-op threads only spin (badly so when
    xdist workers or other jobs share the cores), so run them on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.gradcheck
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("separate_kv", [False, True], ids=["shared-kv", "per-branch-kv"])
def test_gradcheck_nsa_attention(separate_kv, nsa_gradcheck_tolerance):
    """float64 gradcheck of nsa_attention w.r.t. q, k, v, gates (and k_cmp, v_cmp, k_win, v_win)."""
    q, k, v, gates = _inputs(2, 41, 1, 2, 4, 3, requires_grad=True)
    extra = []
    if separate_kv:
        nc = GRAD_CFG.num_cmp(41)
        extra = [torch.randn(2, n, 1, d, dtype=torch.float64, requires_grad=True) for n, d in
                 ((nc, 4), (nc, 3), (41, 4), (41, 3))]

    def fn(q, k, v, gates, *kv):
        kw = dict(kv_cmp=kv[:2], kv_win=kv[2:]) if kv else {}
        return ops.nsa_attention(q, k, v, gates, GRAD_CFG, **kw)

    assert torch.autograd.gradcheck(fn, (q, k, v, gates, *extra), fast_mode=True, **nsa_gradcheck_tolerance)


@pytest.mark.gradcheck
@pytest.mark.usefixtures("one_thread")
def test_gradcheck_mean_compress(nsa_gradcheck_tolerance):
    x = torch.randn(2, 23, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: ops.mean_compress(x, GRAD_CFG), (x,), **nsa_gradcheck_tolerance)


@pytest.mark.gradcheck
@pytest.mark.usefixtures("one_thread")
def test_gradcheck_compressed_attention(nsa_gradcheck_tolerance):
    """Through o and through lse of the rows that see a compressed token (lse = -inf before)."""
    q = torch.randn(1, 30, 2, 4, dtype=torch.float64, requires_grad=True)
    k_cmp = torch.randn(1, 6, 1, 4, dtype=torch.float64, requires_grad=True)
    v_cmp = torch.randn(1, 6, 1, 3, dtype=torch.float64, requires_grad=True)
    first = GRAD_CFG.cmp_block - 1  # the first position that sees a compressed token

    def fn(q, k_cmp, v_cmp):
        o, lse = ops.compressed_attention(q, k_cmp, v_cmp, GRAD_CFG)
        return o, lse[:, first:]

    assert torch.autograd.gradcheck(fn, (q, k_cmp, v_cmp), **nsa_gradcheck_tolerance)


@pytest.mark.gradcheck
@pytest.mark.usefixtures("one_thread")
def test_gradcheck_selected_attention(nsa_gradcheck_tolerance):
    q, k, v, _ = _inputs(1, 40, 1, 2, 4, 3, requires_grad=True)
    idx = ops.select_blocks(q.detach(), ops.mean_compress(k.detach(), GRAD_CFG), GRAD_CFG)
    fn = lambda q, k, v: ops.selected_attention(q, k, v, idx, GRAD_CFG)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), **nsa_gradcheck_tolerance)


@pytest.mark.gradcheck
@pytest.mark.usefixtures("one_thread")
def test_gradcheck_sliding_window_attention(nsa_gradcheck_tolerance):
    q, k, v, _ = _inputs(1, 40, 1, 2, 4, 3, requires_grad=True)
    fn = lambda q, k, v: ops.sliding_window_attention(q, k, v, GRAD_CFG)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), **nsa_gradcheck_tolerance)


@pytest.mark.gradcheck
@pytest.mark.usefixtures("one_thread")
def test_gradcheck_decode_offset(nsa_gradcheck_tolerance):
    """Gradients also hold for queries at q_offset > 0 (a chunk of a continued prefill)."""
    q, k, v, gates = _inputs(1, 37, 1, 2, 4, 3, requires_grad=True)
    fn = lambda q, k, v, g: ops.nsa_attention(q[:, 30:], k, v, g[:, 30:], GRAD_CFG, q_offset=30)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, gates), fast_mode=True, **nsa_gradcheck_tolerance)


# ---------------------------------------------------------------- no NaN before the first compressed token


@pytest.mark.parametrize("T", [1, 5, 7, 8, 20], ids=lambda t: f"T{t}")
def test_no_nan_without_compressed_tokens(T):
    """Queries t < l - 1 get o_cmp = 0, lse = -inf and finite, zero gradients (T < l: no token at all)."""
    q, k, v, gates = _inputs(2, T, 2, 2, 4, 3, requires_grad=True)
    k_cmp, v_cmp = ops.mean_compress(k, SMALL), ops.mean_compress(v, SMALL)
    o, lse = ops.compressed_attention(q, k_cmp, v_cmp, SMALL)
    blind = SMALL.cmp_block - 1  # positions < blind see nothing
    assert torch.equal(o[:, :blind], torch.zeros_like(o[:, :blind]))
    assert torch.isneginf(lse[:, :blind]).all() and torch.isfinite(lse[:, blind:]).all()
    out = ops.nsa_attention(q, k, v, gates, SMALL)
    assert torch.isfinite(out).all()
    (o.sum() + lse[:, blind:].sum() + out.sum()).backward()
    for name, x in zip(("q", "k", "v", "gates"), (q, k, v, gates)):
        assert torch.isfinite(x.grad).all(), name
    q.grad = None
    o2, lse2 = ops.compressed_attention(q, k_cmp, v_cmp, SMALL)
    (o2.sum() + lse2[:, blind:].sum()).backward()
    assert torch.count_nonzero(q.grad[:, :blind]) == 0


# ---------------------------------------------------------------- edge cases of the query axis


@pytest.mark.parametrize("q_offset", [0, 5, 40])
def test_empty_query_chunk(q_offset):
    """Tq = 0 (a step with no new token) returns empty outputs of the right shapes."""
    q, k, v, gates = _inputs(2, 40, 2, 2, 4, 3)
    kh, vh = k[:, :q_offset], v[:, :q_offset]
    out, idx = ops.nsa_attention(q[:, :0], kh, vh, gates[:, :0], SMALL, q_offset=q_offset, return_block_idx=True)
    assert out.shape == (2, 0, 4, 3) and idx.shape == (2, 0, 2, SMALL.sel_count)
    o, lse = ops.compressed_attention(q[:, :0], ops.mean_compress(kh, SMALL), ops.mean_compress(vh, SMALL), SMALL,
                                      q_offset=q_offset)
    assert o.shape == (2, 0, 4, 3) and lse.shape == (2, 0, 4)


@pytest.mark.parametrize("chunk", ["1", "3", "8", "50"])
def test_reference_chunking_is_invisible(chunk, monkeypatch):
    """NSA_REFERENCE_CHUNK only bounds memory: outputs and blocks equal the unchunked ones,
    also for a continued prefill at q_offset > 0."""
    q, k, v, gates = _inputs(2, 77, 2, 2, 6, 5)
    ref, ref_idx = ops.nsa_attention(q, k, v, gates, SMALL, return_block_idx=True, backend="reference")
    monkeypatch.setenv("NSA_REFERENCE_CHUNK", chunk)
    out, idx = ops.nsa_attention(q, k, v, gates, SMALL, return_block_idx=True, backend="reference")
    assert torch.equal(idx, ref_idx) and rel_error(out, ref) <= 1e-13
    out = ops.nsa_attention(q[:, 30:], k, v, gates[:, 30:], SMALL, q_offset=30, backend="reference")
    assert rel_error(out, ref[:, 30:]) <= 1e-13


def test_window_reference_chunks_stay_near_the_band(monkeypatch):
    """A chunk of the window reference scores its queries against the keys of all of them, a
    masked square: chunks of at most ``w`` queries keep each query's keys under ``2w`` (what
    the memory budget counts), where one chunk of 4k queries took 24 GiB at 64 heads."""
    import nsa.ops.window.reference as window_reference

    spans, dense = [], window_reference.dense_attention
    monkeypatch.setattr(window_reference, "dense_attention",
                        lambda q, k, *rest: spans.append((q.shape[1], k.shape[1])) or dense(q, k, *rest))
    q, k, v, _ = _inputs(1, 300, 2, 2, 4, 4)
    ops.sliding_window_attention(q, k, v, SMALL, backend="reference")
    assert sum(queries for queries, _ in spans) == 300
    assert all(queries <= SMALL.window and keys < 2 * SMALL.window for queries, keys in spans), spans


def _branch_calls(q, k, v):
    """``{branch: () -> its reference output}`` over ``q, k, v`` under :data:`SMALL`."""
    k_cmp, v_cmp = ops.mean_compress(k, SMALL), ops.mean_compress(v, SMALL)
    block_idx = ops.select_blocks(q.detach(), k_cmp.detach(), SMALL, backend="reference")
    return {
        "compressed": lambda: ops.compressed_attention(q, k_cmp, v_cmp, SMALL, backend="reference")[0],
        "selected": lambda: ops.selected_attention(q, k, v, block_idx, SMALL, backend="reference"),
        "window": lambda: ops.sliding_window_attention(q, k, v, SMALL, backend="reference"),
    }


@pytest.mark.parametrize("branch", ["compressed", "selected", "window"])
def test_reference_backward_recomputes_each_chunk(branch, monkeypatch):
    """Under autograd each query chunk of a branch's reference is recomputed in the backward: the
    graph keeps what the chunks return, not their scores and gathered keys (which made the
    selected branch's backward take 48 GiB at T = 3001 with 16 KV heads), and the gradients are
    those of one unchunked pass."""
    q, k, v, _ = _inputs(1, 96, 2, 2, 8, 8, requires_grad=True)
    do = torch.randn(1, 96, 4, 8, dtype=torch.float64)
    want = torch.autograd.grad((_branch_calls(q, k, v)[branch]() * do).sum(), (q, k, v))
    monkeypatch.setenv("NSA_REFERENCE_CHUNK", "8")
    call = _branch_calls(q, k, v)[branch]
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
        out = call()
    # Outside the chunks the graph keeps at most a few tensors of the inputs' size (the chunks'
    # own tensors are the checkpoints', not these hooks'); each chunk's scores alone are larger.
    assert sum(kept) <= 2 * (q.numel() + k.numel() + v.numel()), kept
    got = torch.autograd.grad((out * do).sum(), (q, k, v))
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert rel_error(a, b) <= 1e-13, name
