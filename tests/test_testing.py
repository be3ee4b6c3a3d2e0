"""``nsa.testing``: the helpers that every parity test leans on must themselves fail when they should.

Float64 on the CPU, small sizes; the spec oracle of ``_dense`` gives the scores row by row.
"""

from __future__ import annotations

import pytest
import torch

from _dense import spec_block_scores
from nsa import NSAConfig, nsa_attention
from nsa.ops import mean_compress, select_blocks
from nsa.testing import assert_valid_selection, block_scores, nsa_attention_with_blocks, rel_error

CONFIG = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, init_blocks=1, local_blocks=1, window=8)
T, HQ, H, D = 57, 4, 2, 8


@pytest.fixture
def inputs():
    torch.manual_seed(3)
    q = torch.randn(1, T, HQ, D, dtype=torch.float64)
    k = torch.randn(1, T, H, D, dtype=torch.float64)
    v = torch.randn(1, T, H, D, dtype=torch.float64)
    gates = torch.rand(1, T, HQ, 3, dtype=torch.float64)
    return q, k, v, gates


def _free_ends(ref, scores, row):
    """The weakest chosen and the strongest rejected free block of ``row`` (position 40: own
    block 5, forced 0 and 5, two free picks among 1..4)."""
    chosen = ref[row].tolist()
    free = range(1, 40 // CONFIG.sel_block)
    weakest = min((j for j in free if j in chosen), key=lambda j: scores[row][j])
    strongest = max((j for j in free if j not in chosen), key=lambda j: scores[row][j])
    return weakest, strongest


def _swap(idx, row, out, into):
    swapped = idx.clone()
    swapped[row] = torch.tensor(sorted([j for j in idx[row].tolist() if j != out] + [into]), dtype=torch.int32)
    return swapped


def _selection(q, k):
    k_cmp = mean_compress(k, CONFIG, backend="reference")
    return select_blocks(q, k_cmp, CONFIG, backend="reference"), block_scores(q, k_cmp, CONFIG)


@pytest.mark.parametrize("q_offset", [0, 13])
def test_block_scores_are_the_specs(inputs, q_offset):
    """Every visible block's score equals the spec's, query by query; blocks past a query's own
    are -inf; the chunked scores do not depend on the chunk size."""
    q, k, *_ = inputs
    k_cmp = mean_compress(k, CONFIG, backend="reference")
    tq = T - q_offset
    scores = block_scores(q[:, :tq], k_cmp, CONFIG, q_offset=q_offset)
    nblk = (q_offset + tq - 1) // CONFIG.sel_block + 1
    assert scores.shape == (1, tq, H, nblk) and scores.dtype == torch.float64
    G = HQ // H
    for i in range(tq):
        t = q_offset + i
        for h in range(H):
            want = spec_block_scores(q[0, i, h * G : (h + 1) * G], k_cmp[0, :, h], t, CONFIG)
            got = scores[0, i, h]
            assert torch.allclose(got[: len(want)], torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-15)
            assert torch.isinf(got[len(want) :]).all() and (got[len(want) :] < 0).all()


def test_block_scores_chunked(inputs, monkeypatch):
    q, k, *_ = inputs
    k_cmp = mean_compress(k, CONFIG, backend="reference")
    whole = block_scores(q, k_cmp, CONFIG)
    monkeypatch.setenv("NSA_REFERENCE_CHUNK", "5")
    chunked = block_scores(q, k_cmp, CONFIG)
    assert torch.equal(torch.isinf(chunked), torch.isinf(whole))
    assert torch.allclose(chunked, whole, rtol=1e-14, atol=0)


def test_valid_selection_accepts_the_reference_and_counts_near_tie_swaps(inputs):
    q, k, *_ = inputs
    ref, scores = _selection(q, k)
    assert assert_valid_selection(ref, ref, scores, CONFIG) == 0
    # the strongest block left out of one row, raised to within 1e-7 below the weakest chosen one,
    # may take its place
    row = (0, 40, 1)
    weakest, strongest = _free_ends(ref, scores, row)
    tied = scores.clone()
    tied[row + (strongest,)] = tied[row + (weakest,)] * (1 - 1e-7)
    swapped = _swap(ref, row, weakest, strongest)
    assert assert_valid_selection(swapped, ref, tied, CONFIG, eps=1e-6) == 1
    with pytest.raises(AssertionError, match=r"1 rows left out a block scoring above a chosen one by more than "
                       r"1e-08; the most by 1\.00e-07 \(relative\), at \[b, t, h\] = \[0, 40, 1\]"):
        assert_valid_selection(swapped, ref, tied, CONFIG, eps=1e-8)
    with pytest.raises(AssertionError, match="left out a block scoring above a chosen one"):
        assert_valid_selection(swapped, ref, scores, CONFIG, eps=1e-6)  # no tie under the true scores


def test_valid_selection_rejects_malformed_rows(inputs):
    q, k, *_ = inputs
    ref, scores = _selection(q, k)
    assert ref[0, 20, 0].tolist() == [0, 1, 2, -1]  # three blocks visible: all chosen
    cases = {
        "a forced block is missing": (40, [1, 2, 3, 5]),
        "indices must ascend": (40, list(reversed(ref[0, 40, 0].tolist()))),
        "padding -1 must come last": (20, [0, 1, -1, 2]),
        "another number of blocks": (40, [0, 5, -1, -1]),
    }
    for message, (t, blocks) in cases.items():
        bad = ref.clone()
        bad[0, t, 0] = torch.tensor(blocks, dtype=torch.int32)
        with pytest.raises(AssertionError, match=message):
            assert_valid_selection(bad, ref, scores, CONFIG)
    with pytest.raises(AssertionError, match="int32"):
        assert_valid_selection(ref.long(), ref, scores, CONFIG)


def test_valid_selection_rejects_a_reference_that_is_no_top_n(inputs):
    """A valid top-n that differs from ``ref_idx`` without a near-tie: the two cannot both be right."""
    q, k, *_ = inputs
    ref, scores = _selection(q, k)
    row = (0, 40, 1)
    wrong = _swap(ref, row, *_free_ends(ref, scores, row))
    with pytest.raises(AssertionError, match="1 rows differ from the reference without a near-tie"):
        assert_valid_selection(ref, wrong, scores, CONFIG)


def test_nsa_attention_with_blocks(inputs):
    """With the reference's own blocks it is the reference's ``nsa_attention``, gradients
    included; another valid-looking selection changes the output."""
    q, k, v, gates = inputs
    ref, scores = _selection(q, k)
    leaves = [x.clone().requires_grad_() for x in inputs]
    want = nsa_attention(*leaves, CONFIG, backend="reference")
    want.sum().backward()
    want_grads = [x.grad for x in leaves]
    leaves = [x.clone().requires_grad_() for x in inputs]
    got = nsa_attention_with_blocks(*leaves, CONFIG, ref)
    got.sum().backward()
    assert rel_error(got, want) <= 1e-14
    for a, b in zip((x.grad for x in leaves), want_grads):
        assert rel_error(a, b) <= 1e-13
    other = _swap(ref, (0, 40, 0), *_free_ends(ref, scores, (0, 40, 0)))
    assert rel_error(nsa_attention_with_blocks(q, k, v, gates, CONFIG, other)[:, 40], want[:, 40]) > 1e-3


def test_record_comparisons_sees_every_assert_close_in_its_block():
    """Passed and failed comparisons, in order, with their errors and bounds; nested blocks each
    see what was compared while they were open; nothing is recorded once a block closes."""
    from nsa.testing import assert_close, record_comparisons

    want = torch.ones(8, dtype=torch.float64)
    with record_comparisons() as outer:
        assert_close("o", want * 1.002, want, 1e-2)
        with record_comparisons() as inner:
            with pytest.raises(AssertionError, match="dq: relative error 3.000e-02 exceeds 2.0e-02"):
                assert_close("dq", want * 1.03, want, 2e-2)
        assert_close("lse", want, want, 1e-6)
    assert_close("dk", want, want, 1e-6)
    assert [(c.name, c.bound, c.dtype) for c in outer] == [("o", 1e-2, "float64"), ("dq", 2e-2, "float64"),
                                                           ("lse", 1e-6, "float64")]
    assert [c.name for c in inner] == ["dq"]
    assert outer[0].share == pytest.approx(0.2) and inner[0].share == pytest.approx(1.5) and outer[2].share == 0.0
    nan = want.clone()
    nan[3] = float("nan")
    with record_comparisons() as found, pytest.raises(AssertionError):
        assert_close("o", nan, want, 1e-2)
    assert found[0].error == float("inf") and found[0].share == float("inf")


@pytest.mark.parametrize("requires_grad", [False, True])
def test_the_suites_empty_tensors_come_poisoned(requires_grad):
    """tests/conftest.py fills every float ``torch.empty`` of a test with NaN, so an element no
    kernel writes fails its comparison; leaves that require grad too (torch 2.11's checkpoint
    makes one, and an in-place fill of it outside ``no_grad`` raises). Integer ones take their
    dtype's largest value (session 43: a top-n attempt left candidate slots unwritten, which the
    step before's values hid)."""
    for made in (torch.empty(3, requires_grad=requires_grad), torch.empty_like(torch.ones(2)),
                 torch.ones(1).new_empty(4)):
        assert made.isnan().all()
    for dtype in (torch.int32, torch.int64, torch.uint8):
        assert (torch.empty(2, dtype=dtype) == torch.iinfo(dtype).max).all()
    assert torch.ones(1, dtype=torch.int64).new_empty(3).eq(torch.iinfo(torch.int64).max).all()
