"""Triton decode (``nsa.ops.decode``) against the reference prefill: outputs and selected blocks.

"Every step" in one launch: a sequence of T tokens is laid out as T rows of a
batch whose cache is the same sequence (expanded, stride 0) with lengths
``seq_lens = 1 .. T``; row ``t`` is then the decode step at position ``t``,
and it must equal query ``t`` of one reference prefill (spec identity 3),
blocks included. Lengths 1..T cover prefills that are and are not multiples
of ``cmp_stride``/``sel_block``, steps before any compressed token exists,
and both the "all blocks fit" and the top-n regimes. Cache positions past
each length hold NaN, so a kernel that reads them fails. On CPU the kernels
run through Triton's interpreter at small sizes; ``gpu`` cases run real sizes in bf16.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

import triton
import triton.language as tl

from _kernel_inputs import every_launch, spy_launches
from nsa import NSAConfig, nsa_attention
from nsa.ops import mean_compress
from nsa.ops._triton.device import sized_as
from nsa.ops.decode import nsa_decode
from nsa.ops.decode.topn import top_of_sorted_runs
from nsa.testing import assert_close, decode_row_reference

SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)
WIDE = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=3, init_blocks=1, local_blocks=1, window=20)
TINY = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, sel_count=3, init_blocks=1, local_blocks=1, window=8)
# no forced blocks: not yet scored blocks tie at exactly 0 and the lower index must win
NO_FORCED = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, sel_count=3, init_blocks=0, local_blocks=0, window=6)


def _sequence(T, HQ, H, DK, DV, config, device, dtype=torch.float32):
    """One random sequence: queries, gates, per-branch raw k/v and mean-compressed tokens."""
    q = torch.randn(1, T, HQ, DK, device=device, dtype=dtype)
    gates = torch.rand(1, T, HQ, 3, device=device, dtype=dtype)
    kv = {name: torch.randn(1, T, H, DK if name[0] == "k" else DV, device=device, dtype=dtype)
          for name in ("k", "v", "k_win", "v_win", "k_raw", "v_raw")}  # fmt: skip
    kv["k_cmp"], kv["v_cmp"] = mean_compress(kv["k_raw"], config), mean_compress(kv["v_raw"], config)
    return q, gates, kv


def _prefill(q, gates, kv, config):
    """float64 reference prefill: ``(o [1, T, HQ, DV], block_idx [1, T, H, n])``."""
    d = {name: t.double() for name, t in kv.items()}
    return nsa_attention(
        q.double(), d["k"], d["v"], gates.double(), config, kv_cmp=(d["k_cmp"], d["v_cmp"]),
        kv_win=(d["k_win"], d["v_win"]), backend="reference", return_block_idx=True,
    )  # fmt: skip


def _every_step(q, gates, kv, config, tokens=1, launch=None, lens=None, **kwargs):
    """Decode of positions ``tokens-1 .. T-1`` as rows ``t`` with ``seq_lens = t + 1``: ``tokens``
    new queries per row (the last ones of the prefix), caches expanded and NaN past each length.
    With ``launch``, the Triton kernels run directly with those launch overrides. ``lens``: only
    these lengths (int32, ascending), one row each."""
    T = q.shape[1]
    if lens is None:
        lens = torch.arange(tokens, T + 1, device=q.device, dtype=torch.int32)
    rows = lens.numel()

    def cache(t, n_valid):  # [1, L, H, D] -> [rows, L, H, D] with NaN past row r's n_valid[r]
        out = t.expand(rows, *t.shape[1:]).clone()
        out[torch.arange(t.shape[1], device=t.device)[None, :] >= n_valid[:, None]] = float("nan")
        return out

    n_cmp = torch.tensor([config.num_cmp(int(n)) for n in lens], device=q.device)
    c = {name: cache(t, n_cmp if "cmp" in name else lens) for name, t in kv.items() if "raw" not in name}
    pick = torch.arange(tokens, device=q.device)[None, :] + (lens - tokens).long()[:, None]  # [rows, tokens]
    if launch is not None:
        from nsa.ops.decode.kernel import decode_fwd

        return decode_fwd(q[0, pick], c["k"], c["v"], gates[0, pick], lens, c["k_cmp"], c["v_cmp"], c["k_win"], c["v_win"],
                          config, config.softmax_scale(q.shape[-1]), **launch)  # fmt: skip
    return nsa_decode(
        q[0, pick], c["k"], c["v"], gates[0, pick], lens, config, kv_cmp=(c["k_cmp"], c["v_cmp"]),
        kv_win=(c["k_win"], c["v_win"]), return_block_idx=True, **kwargs,
    )  # fmt: skip


def _rows_of_one_sequence(q, gates, kv, lens, config, **launch):
    """``decode_fwd`` (launch overrides ``launch``) of one new token per row, row ``r`` being the
    sequence's prefix of ``lens[r]`` tokens over its own caches (expanded, stride 0)."""
    from nsa.ops.decode.kernel import decode_fwd

    ex = {name: t.expand(lens.numel(), *t.shape[1:]) for name, t in kv.items()}
    last = lens.long() - 1
    return decode_fwd(q[0, last, None], ex["k"], ex["v"], gates[0, last, None], lens, ex["k_cmp"], ex["v_cmp"],
                      ex["k_win"], ex["v_win"], config, config.softmax_scale(q.shape[-1]), **launch)  # fmt: skip


EVERY_STEP = [
    # (T, HQ, H, DK, DV, config, tokens)
    pytest.param(45, 1, 1, 32, 16, SMALL, 1, id="T45-HQ1-H1-G1-DK32-DV16"),
    pytest.param(41, 4, 1, 24, 40, WIDE, 1, id="T41-HQ4-H1-G4-DK24-DV40-sel16"),
    pytest.param(29, 16, 1, 16, 16, NO_FORCED, 1, id="T29-HQ16-H1-G16-no-forced-blocks"),
    pytest.param(27, 2, 1, 16, 32, TINY, 3, id="T27-HQ2-H1-G2-three-new-tokens"),
]


@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize("T, HQ, H, DK, DV, config, tokens", EVERY_STEP)
def test_decode_every_step_equals_prefill(T, HQ, H, DK, DV, config, tokens, nsa_device, nsa_tolerance):
    q, gates, kv = _sequence(T, HQ, H, DK, DV, config, nsa_device)
    ref_o, ref_idx = _prefill(q, gates, kv, config)
    o, idx = _every_step(q, gates, kv, config, tokens, backend="triton")
    rows = torch.arange(tokens, device=q.device)[None, :] + torch.arange(T - tokens + 1, device=q.device)[:, None]
    assert o.dtype == q.dtype and idx.dtype == torch.int32
    assert_close("o", o, ref_o[0, rows], nsa_tolerance(q.dtype))
    assert torch.equal(idx, ref_idx[0, rows]), "decode selected other blocks than the prefill"


# score tiles of 16 compressed tokens that do not start on a block boundary (16*4 % 12 != 0),
# and compressed blocks that span three selection blocks
MISALIGNED = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=12, sel_count=3, window=10)
EIGHT = NSAConfig(cmp_block=4, cmp_stride=2, sel_block=4, sel_count=8, window=8)  # n = 8 of up to 18 blocks
SPAN3 = NSAConfig(cmp_block=12, cmp_stride=4, sel_block=4, sel_count=5, init_blocks=0, local_blocks=1, window=10)


@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize(
    "config, splits, block_tile, token_tile, extra",
    [
        # the window's splits in the compressed launch (small caches default to the selected one)
        pytest.param(SMALL, (3, 2, 2), None, None, {"window_in_selected": False}, id="cmp3-win2-slc2"),
        pytest.param(SMALL, (1, 1, 4), 4, 16, {}, id="one-split-each-multi-tile-topn"),
        pytest.param(MISALIGNED, (2, 1, 1), None, 16, {}, id="tiles-off-block-boundaries"),
        pytest.param(SPAN3, (3, 1, 2), 8, 16, {}, id="cmp-block-spans-3-sel-blocks"),
        # the combine reads 2 of 9 splits at a time; score tiles of 2 blocks give 5 tiles of
        # candidates (2 found, 2 padding slots each), and top-n scans them 8 at a time
        pytest.param(SMALL, (4, 3, 2), 8, 16, {"combine_chunk": 2, "score_blocks": 2}, id="combine-chunks-score-tiles-of-2"),
        pytest.param(TINY, (2, 1, 1), None, 16, {"score_blocks": 4}, id="candidates-from-many-tiles"),
        # whole compressed tiles through tensor descriptors, the last partial one through
        # masked loads; 8-token tiles so that rows have both
        pytest.param(SMALL, (2, 1, 2), None, None, {"cmp_desc": True, "cmp_tile": 8}, id="cmp-tensor-descriptors"),
        pytest.param(MISALIGNED, (1, 1, 1), None, 16, {"cmp_desc": True, "win_desc": True, "cmp_tile": 4, "window_in_selected": False},
                     id="cmp-win-descriptors"),  # fmt: skip
        # contiguous scoring reads, with several score tiles per row (and the SPAN3 geometry,
        # where l/d = 3 reaches two tokens back)
        pytest.param(SMALL, (3, 1, 2), None, None, {"score_contig": True, "score_blocks": 2}, id="score-contiguous"),
        pytest.param(SPAN3, (2, 1, 2), 8, 16, {"score_contig": True, "score_blocks": 4}, id="score-contiguous-span3"),
        pytest.param(TINY, (2, 1, 1), None, 16, {"score_contig": True, "score_blocks": 4}, id="score-contiguous-many-tiles"),
        # the compressed pass leaves block masses by default where the geometry allows; the
        # logits it leaves otherwise, on a geometry that allows masses; tiles of one block,
        # where every block takes the previous tile's tail; masses through descriptors
        pytest.param(SMALL, (3, 1, 2), None, None, {"score_mass": False, "score_blocks": 2}, id="score-logits-contiguous"),
        pytest.param(WIDE, (2, 1, 1), None, 16, {"cmp_tile": 4, "score_blocks": 2}, id="score-mass-one-block-tiles"),
        pytest.param(WIDE, (3, 1, 1), None, 16, {"cmp_desc": True, "cmp_tile": 8}, id="score-mass-descriptors"),
        # selected blocks through tensor descriptors, 2 and 1 blocks a program; top-n
        # rounds of 2 and 4 keys (SMALL picks 4 blocks), and of 4 falling back to 1 (n = 3)
        pytest.param(SMALL, (2, 1, 2), None, None, {"sel_desc": True}, id="sel-tensor-descriptors"),
        pytest.param(WIDE, (1, 1, 1), None, 16, {"sel_desc": True, "topn_per_round": 4, "topn_bitonic": False},
                     id="sel-descriptors-topn4-n3"),  # fmt: skip
        pytest.param(SMALL, (1, 1, 1), None, 16, {"topn_per_round": 2, "score_blocks": 2, "topn_bitonic": False}, id="topn-rounds-of-2"),
        pytest.param(SMALL, (1, 1, 4), None, 16, {"topn_per_round": 4, "score_blocks": 2, "topn_bitonic": False}, id="topn-rounds-of-4"),
        pytest.param(EIGHT, (1, 1, 2), None, 16, {"topn_per_round": 8, "score_blocks": 8, "topn_bitonic": False}, id="topn-rounds-of-8"),
        # one bitonic top-k over the candidates (the default where they fit one tile): n = 3
        # of 4 taken, n = 8 over 2 blocks a program, and the rounds' own cases above
        pytest.param(WIDE, (1, 1, 1), None, 16, {"sel_desc": True, "score_blocks": 2, "topn_bitonic": True}, id="topn-bitonic-n3"),
        pytest.param(EIGHT, (1, 1, 2), None, 16, {"score_blocks": 8, "topn_bitonic": True}, id="topn-bitonic-n8"),
        pytest.param(SMALL, (1, 1, 4), None, 16, {"score_blocks": 2, "topn_bitonic": True}, id="topn-bitonic-4-a-program"),
        # no forced blocks (every block's key is its score), by the top-k and by the rounds
        pytest.param(NO_FORCED, (1, 1, 1), None, 16, {"score_blocks": 2, "topn_bitonic": True}, id="topn-bitonic-no-forced"),
        pytest.param(NO_FORCED, (1, 1, 1), None, 16, {"score_blocks": 2, "topn_bitonic": False}, id="topn-rounds-no-forced"),
        # the window's splits as programs of the selected launch (8-token tiles: several per split)
        pytest.param(SMALL, (2, 3, 2), None, None, {"window_in_selected": True, "win_tile": 8}, id="window-in-selected"),
        pytest.param(MISALIGNED, (1, 1, 1), None, 16, {"window_in_selected": True, "sel_desc": True}, id="window-in-selected-desc"),
        pytest.param(SMALL, (2, 1, 2), None, None, {"l2_hints": True, "cmp_desc": True, "cmp_tile": 8}, id="l2-hints"),
        # the combine merges every slot after its wait (by default launch 1's slots before it)
        pytest.param(SMALL, (3, 2, 2), None, None, {"combine_early": False, "window_in_selected": False}, id="combine-all-late"),
        # one score tile holds every block of a row: its candidates are the top-n, no rounds
        pytest.param(SMALL, (2, 1, 2), None, None, {"score_blocks": 16}, id="one-score-tile-ranked"),
        pytest.param(SMALL, (2, 1, 2), None, None, {"score_blocks": 4}, id="score-tiles-then-topk"),
    ],
)
def test_decode_launch_variants(config, splits, block_tile, token_tile, extra, nsa_device, nsa_tolerance):
    """Split counts, a top-n that scans several candidate tiles, small token tiles, odd
    geometry, a combine over several chunks of splits and many score tiles per row."""
    T, HQ, H = 70, 4, 2
    q, gates, kv = _sequence(T, HQ, H, 16, 16, config, nsa_device)
    ref_o, ref_idx = _prefill(q, gates, kv, config)
    lens = torch.tensor([70, 9, 41], device=nsa_device, dtype=torch.int32)
    o, idx = _rows_of_one_sequence(q, gates, kv, lens, config, splits=splits, block_tile=block_tile,
                                   token_tile=token_tile, **extra)  # fmt: skip
    assert_close("o", o[:, 0], ref_o[0, lens.long() - 1], nsa_tolerance(torch.float32))
    assert torch.equal(idx[:, 0], ref_idx[0, lens.long() - 1])


@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize(
    "launch",
    [
        pytest.param({}, id="parts"),
        pytest.param({"combine_chunk": 2}, id="parts-in-chunks-of-2"),
        pytest.param({"combine_early": False}, id="all-after-the-wait"),
        pytest.param({"window_in_selected": True}, id="window-after-the-wait"),
    ],
)
def test_decode_one_row_combine_parts(launch, nsa_device, nsa_tolerance):
    """One row: the combine merges the compressed launch's branches (the compressed one, and the
    window where that launch runs it) before its wait and the rest after it, each branch in
    tiles of its own width (3 compressed, 2 window and 4 selected slots)."""
    T, HQ, H = 70, 4, 2
    q, gates, kv = _sequence(T, HQ, H, 16, 16, SMALL, nsa_device)
    ref_o, ref_idx = _prefill(q, gates, kv, SMALL)
    lens = torch.tensor([T], device=nsa_device, dtype=torch.int32)
    launch = {"window_in_selected": False, **launch}
    o, idx = _rows_of_one_sequence(q, gates, kv, lens, SMALL, splits=(3, 2, 1), **launch)
    assert_close("o", o[:, 0], ref_o[0, lens.long() - 1], nsa_tolerance(torch.float32))
    assert torch.equal(idx[:, 0], ref_idx[0, lens.long() - 1])


@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize(
    "config, launch",
    [
        # the query's own block reaches past the length (NaN there) and is read from
        # seq_len - l' on; rows shorter than one block take the plain loads
        pytest.param(SMALL, {"sel_desc": True, "splits": (2, 1, 2)}, id="sel-descriptors-small"),
        pytest.param(WIDE, {"sel_desc": True, "splits": (1, 1, 2)}, id="sel-descriptors-wide"),
        pytest.param(NO_FORCED, {"sel_desc": True, "splits": (1, 1, 1)}, id="sel-descriptors-no-forced"),
        # with descriptors the forced blocks are attended before the wait for the scores (init
        # and local blocks at the ends of the ranks, one block a program too), or after it
        pytest.param(WIDE, {"sel_desc": True, "splits": (1, 1, 1)}, id="sel-descriptors-one-block-a-program"),
        pytest.param(SMALL, {"sel_desc": True, "forced_early": False, "splits": (2, 1, 2)}, id="sel-descriptors-forced-after-the-wait"),
        pytest.param(SMALL, {"sel_desc": True, "topn_per_round": 4, "topn_bitonic": False, "splits": (1, 1, 1)}, id="sel-descriptors-topn4"),
        pytest.param(SMALL, {"window_in_selected": True, "splits": (2, 2, 2)}, id="window-in-selected"),
        pytest.param(SMALL, {"window_in_selected": False, "splits": (2, 2, 1)}, id="window-in-compressed"),
        pytest.param(WIDE, {"l2_hints": True, "window_in_selected": True, "splits": (2, 1, 1)}, id="l2-hints"),
        pytest.param(SMALL, {"score_blocks": 8, "splits": (2, 1, 1)}, id="one-score-tile-ranked"),
        pytest.param(SMALL, {"score_blocks": 2, "splits": (2, 1, 1)}, id="score-tiles-then-topk"),
        pytest.param(SMALL, {"score_mass": False, "splits": (2, 1, 1)}, id="score-logits"),
        pytest.param(WIDE, {"cmp_tile": 4, "score_blocks": 2, "splits": (3, 1, 1)}, id="score-mass-one-block-tiles"),
    ],
)
def test_decode_every_step_launch_overrides(config, launch, nsa_device, nsa_tolerance):
    """Steps of a sequence, caches NaN past each length, under launch overrides: the lengths at
    and just past every multiple of 4 (each compressed token's emission, each selection block's
    start in these configs) and the last one; ``test_decode_every_step_equals_prefill`` takes
    every step under the default launches. Half the rows halve the interpreter's time (every step
    took about 20 s a case on a 2-core CI machine)."""
    T, HQ, H = 45, 4, 2
    q, gates, kv = _sequence(T, HQ, H, 16, 32, config, nsa_device)
    ref_o, ref_idx = _prefill(q, gates, kv, config)
    lens = [n for n in range(1, T + 1) if n % 4 in (0, 1) or n == T]
    lens = torch.tensor(lens, device=nsa_device, dtype=torch.int32)
    o, idx = _every_step(q, gates, kv, config, launch=launch, lens=lens)
    at = lens.long() - 1
    assert_close("o", o[:, 0], ref_o[0, at], nsa_tolerance(q.dtype))
    assert torch.equal(idx[:, 0], ref_idx[0, at]), "decode selected other blocks than the prefill"


def _batch_of_sequences(lens, HQ, H, D, config, device, dtype):
    """B different sequences in caches of capacity max(lens) + 5, NaN past each length."""
    cap = max(lens) + 5
    seq = [_sequence(cap, HQ, H, D, D, config, device, dtype) for _ in lens]
    kv = {name: torch.cat([s[2][name] for s in seq]) for name in seq[0][2] if "raw" not in name}
    for b, n in enumerate(lens):
        for name, t in kv.items():
            t[b, (config.num_cmp(n) if "cmp" in name else n):] = float("nan")
    return seq, kv, torch.tensor(lens, device=device, dtype=torch.int32)


@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize("tokens", [1, 2])
def test_decode_batch_with_different_lengths(tokens, nsa_device, nsa_tolerance):
    config, lens = WIDE, [5, 33, 60]
    seq, kv, seq_lens = _batch_of_sequences(lens, 8, 2, 32, config, nsa_device, torch.float32)
    q = torch.cat([s[0][:, n - tokens : n] for s, n in zip(seq, lens)])
    gates = torch.cat([s[1][:, n - tokens : n] for s, n in zip(seq, lens)])
    args = (q, kv["k"], kv["v"], gates, seq_lens, config)
    pairs = dict(kv_cmp=(kv["k_cmp"], kv["v_cmp"]), kv_win=(kv["k_win"], kv["v_win"]), return_block_idx=True)
    o, idx = nsa_decode(*args, backend="triton", **pairs)
    for b, n in enumerate(lens):  # each sequence against its own prefill of n tokens
        one = {name: t[:, :n] for name, t in seq[b][2].items()}
        ref_o, ref_idx = _prefill(seq[b][0][:, :n], seq[b][1][:, :n], one, config)
        assert_close(f"o[{b}]", o[b], ref_o[0, n - tokens :], nsa_tolerance(torch.float32))
        assert torch.equal(idx[b], ref_idx[0, n - tokens :])


@pytest.mark.parity
def test_reference_decode_equals_prefill():
    """The reference path alone (no Triton), float64: decode == prefill up to rounding."""
    config, lens = SMALL, [17, 64, 3]
    seq, kv, seq_lens = _batch_of_sequences(lens, 4, 2, 8, config, torch.device("cpu"), torch.float64)
    q = torch.cat([s[0][:, n - 1 : n] for s, n in zip(seq, lens)])
    gates = torch.cat([s[1][:, n - 1 : n] for s, n in zip(seq, lens)])
    o, idx = nsa_decode(q, kv["k"], kv["v"], gates, seq_lens, config, kv_cmp=(kv["k_cmp"], kv["v_cmp"]),
                        kv_win=(kv["k_win"], kv["v_win"]), backend="reference", return_block_idx=True)  # fmt: skip
    for b, n in enumerate(lens):
        one = {name: t[:, :n] for name, t in seq[b][2].items()}
        ref_o, ref_idx = _prefill(seq[b][0][:, :n], seq[b][1][:, :n], one, config)
        assert (o[b, 0] - ref_o[0, -1]).abs().max() < 1e-12
        assert torch.equal(idx[b, 0], ref_idx[0, -1])


def test_decode_rejects_bad_arguments():
    q, gates = torch.randn(2, 1, 4, 8), torch.rand(2, 1, 4, 3)
    k, v = torch.randn(2, 40, 2, 8), torch.randn(2, 40, 2, 8)
    kc, vc = torch.randn(2, 9, 2, 8), torch.randn(2, 9, 2, 8)
    lens = torch.tensor([10, 40], dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_lens must be int32"):
        nsa_decode(q, k, v, gates, lens.long(), SMALL, kv_cmp=(kc, vc))
    with pytest.raises(ValueError, match=r"seq_lens must lie in \[Tq, capacity\]"):
        nsa_decode(q, k, v, gates, torch.tensor([10, 41], dtype=torch.int32), SMALL, kv_cmp=(kc, vc))
    with pytest.raises(ValueError, match="k_cmp capacity"):
        nsa_decode(q, k, v, gates, lens, SMALL, kv_cmp=(kc[:, :5], vc[:, :5]))
    with pytest.raises(ValueError, match=r"v_cmp must have shape \[2, capacity, 2, 8\]"):
        nsa_decode(q, k, v, gates, lens, SMALL, kv_cmp=(kc, vc[:, :, :1]))
    with pytest.raises(ValueError, match="gates must have shape"):
        nsa_decode(q, k, v, gates[:, :, :2], lens, SMALL, kv_cmp=(kc, vc))
    with pytest.raises(TypeError, match="kv_cmp must be a"):
        nsa_decode(q, k, v, gates, lens, SMALL, kv_cmp=kc)
    with pytest.raises(RuntimeError, match="no backward"):
        nsa_decode(q.requires_grad_(), k, v, gates, lens, SMALL, kv_cmp=(kc, vc))


def _real_size_inputs(lens, HQ, H, DK, DV, config, device):
    """bf16 decode inputs of one new token per sequence, caches of capacity ``max(lens)``:
    ``(q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win)``, the compressed pair pooled from
    ``(k, v)``."""
    B, cap = len(lens), max(lens)
    bf = dict(device=device, dtype=torch.bfloat16)
    q, gates = torch.randn(B, 1, HQ, DK, **bf), torch.rand(B, 1, HQ, 3, **bf)
    k, k_win = (torch.randn(B, cap, H, DK, **bf) for _ in range(2))
    v, v_win = (torch.randn(B, cap, H, DV, **bf) for _ in range(2))
    seq_lens = torch.tensor(lens, device=device, dtype=torch.int32)
    return q, k, v, gates, seq_lens, mean_compress(k, config), mean_compress(v, config), k_win, v_win


def test_decode_rejects_bad_pdl_flags():
    """``pdl`` is one flag or one per dependent launch (score, selected, combine); checked
    before anything is launched, so the CPU sees it too."""
    config, T = SMALL, 12
    q, gates, kv = _sequence(T, 4, 2, 8, 8, config, torch.device("cpu"))
    for bad in ((True, False), (True, True, True, True)):
        with pytest.raises(ValueError, match=r"pdl must be a bool or three flags \(score, selected, combine"):
            _every_step(q, gates, kv, config, launch={"pdl": bad}, lens=torch.tensor([T], dtype=torch.int32))


@pytest.mark.parametrize("name", ["block_tile", "token_tile", "cmp_tile", "win_tile"])
@pytest.mark.parametrize("tile", [0, 48])
def test_decode_rejects_tiles_that_are_not_powers_of_two(name, tile):
    """A tile override is the length of a ``tl.arange``: a clear error names it before any
    launch, instead of Triton's failure inside a compile."""
    config, T = SMALL, 12
    q, gates, kv = _sequence(T, 4, 2, 8, 8, config, torch.device("cpu"))
    with pytest.raises(ValueError, match=f"{name} must be a power of two, got {tile}"):
        _every_step(q, gates, kv, config, launch={name: tile}, lens=torch.tensor([T], dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize(
    "lens",
    [
        pytest.param([8192], id="B1-8k"),
        pytest.param([65536 - 77], id="B1-64k"),
        # a batch that fills the GPU: descriptor loads, block masses, the window's programs in
        # the selected launch (which start during the compressed pass under PDL)
        pytest.param([8192 - 37 * i for i in range(16)], id="B16-8k-unequal"),
    ],
)
def test_decode_pdl_per_launch_changes_nothing_but_timing(lens, nsa_device):
    """Which of the score, selected and combine launches start early (programmatic dependent
    launch) changes when they start, never what they compute: every combination is bitwise
    equal to PDL on all three and off on all three (bf16, paper geometry; batch 1, and a
    batch of 16 that takes the launches of a full GPU)."""
    from nsa.ops._triton.device import pdl_supported
    from nsa.ops.decode.kernel import decode_fwd

    if not pdl_supported(torch.device(nsa_device)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 or later")
    config = NSAConfig()
    q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win = _real_size_inputs(lens, 64, 4, 128, 128, config, nsa_device)
    args = (q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win, config, config.softmax_scale(128))
    want_o, want_idx = decode_fwd(*args, pdl=True)
    plain_o, plain_idx = decode_fwd(*args, pdl=False)
    assert torch.equal(want_o, plain_o) and torch.equal(want_idx, plain_idx)
    for early in ((False, True, True), (True, False, True), (True, True, False), (False, False, True)):
        o, idx = decode_fwd(*args, pdl=early)
        assert torch.equal(o, want_o) and torch.equal(idx, want_idx), f"pdl={early} changed the result"


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parametrize("batch", [1, 16])
def test_decode_starts_every_launch_early_by_default(batch, nsa_device, monkeypatch):
    """On Hopper and later the default starts the score, selected and combine launches early at
    any batch, also once the batch fills the GPU (batch 16: 40.1 against 42.8 us at 8k on an
    H200, session 42; off there before)."""
    from nsa.ops._triton.device import pdl_supported
    from nsa.ops.decode import kernel

    if not pdl_supported(torch.device(nsa_device)):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 or later")
    config = NSAConfig()
    asked, launch_options = [], kernel.pdl_launch
    monkeypatch.setattr(kernel, "pdl_launch", lambda on: asked.append(on) or launch_options(on))
    args = _real_size_inputs([4096] * batch, 64, 4, 128, 128, config, nsa_device)
    kernel.decode_fwd(*args, config, config.softmax_scale(128))
    assert asked == [True, True, True]


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize(
    "lens, HQ, H, DK, DV",
    [
        pytest.param([8192, 5001], 64, 4, 128, 128, id="B2-8k-5001-HQ64-H4-D128"),
        pytest.param([4099], 16, 1, 192, 128, id="B1-4099-HQ16-H1-DK192-DV128"),
        # a batch that fills the GPU: one-wave compressed launch, block masses, window in the
        # selected launch, one-warp score programs (past four a SM at 32k)
        pytest.param([32768 - 1531 * i for i in range(16)], 64, 4, 128, 128, id="B16-32k-unequal-HQ64-H4-D128"),
        # the largest batch the tables time: one compressed split a row-group, 8 blocks a selection
        # program (a batch-64 check once picked other blocks than the reference, session 50); with
        # the float32 reference's copies its peak was 49.7 GiB on an H200
        pytest.param([65536 - 1021 * i for i in range(64)], 64, 4, 128, 128, id="B64-64k-unequal-HQ64-H4-D128",
                     marks=pytest.mark.requires(memory_gib=56)),
    ],
)
def test_decode_bf16_real_sizes(lens, HQ, H, DK, DV, nsa_device):
    """bf16 kernel vs the float32 reference at paper geometry (``_check_bf16_real_size``)."""
    _check_bf16_real_size(lens, HQ, H, DK, DV, nsa_device)


@pytest.mark.gpu
@pytest.mark.triton
def test_score_tiles_keep_n_candidates_once_the_batch_fills_the_gpu(nsa_device):
    """Every score tile of 32 visible blocks keeps its n best keys as candidates (batch 16, 64k:
    block masses, one-warp score programs). Each key is ranked against its tile's keys as other
    lanes hold them; with multiplies fused into the sums across lanes, a key's copies could differ
    in the last bit and a key outrank itself. On an H200, 6 of the 6144 tiles of three such steps
    kept 15 (session 43), until the score launch compiled without fusion."""
    from nsa.ops.decode.kernel import decode_fwd

    config = NSAConfig()
    short = []
    for _ in range(3):
        args = _real_size_inputs([65536] * 16, 64, 4, 128, 128, config, nsa_device)
        with every_launch() as launches:
            decode_fwd(*args, config, config.softmax_scale(128))
        cand = next(kw["args"][4] for name, kw in launches if name == "decode_score_kernel")
        kept = (cand.view(cand.shape[0], -1, config.sel_count) >= 0).sum(-1)
        short.append(int((kept < config.sel_count).sum()))
    assert short == [0, 0, 0], f"score tiles with fewer than n candidates, per step: {short}"


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.parametrize("gpu", ["a100", "rtx4090"])
@pytest.mark.parametrize(
    "lens, HQ, H, DK, DV",
    [
        pytest.param([8192, 5001], 64, 4, 128, 128, id="B2-8k-5001-HQ64-H4-D128"),
        pytest.param([16384 - 511 * i for i in range(16)], 64, 4, 128, 128, id="B16-16k-unequal-HQ64-H4-D128"),
    ],
)
def test_decode_sized_for_other_gpus_real_size(gpu, lens, HQ, H, DK, DV, nsa_device):
    """The decode launches of an A100 or a consumer GPU (no bulk copies at batch 16, no
    programmatic dependent launch) compute the same step (``nsa.ops._triton.device.sized_as``)."""
    with sized_as(gpu):
        _check_bf16_real_size(lens, HQ, H, DK, DV, nsa_device)


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.parity
@pytest.mark.requires(feature="triton_float32")
def test_decode_float32_head_dim_128_on_gpu(monkeypatch, nsa_device, nsa_tolerance):
    """Exact float32 products at head dim 128: the compressed pass takes one pipeline stage (in
    Triton's default three its tiles ask 264 KiB, past an H100's 227, compiled for sm_90) and
    matches the float64 reference."""
    monkeypatch.setenv("NSA_FLOAT32_DOT", "ieee")
    config = NSAConfig()
    ins = _real_size_inputs([4099, 3001], 16, 1, 128, 128, config, nsa_device)
    f32 = [t.float() if t.is_floating_point() else t for t in ins]
    q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win = f32
    kw = dict(kv_cmp=(k_cmp, v_cmp), kv_win=(k_win, v_win), return_block_idx=True)
    o, idx = nsa_decode(q, k, v, gates, seq_lens, config, backend="triton", **kw)
    up = [t.double() if t.is_floating_point() else t for t in f32]
    ref_o, ref_idx = nsa_decode(*up[:5], config, backend="reference", kv_cmp=tuple(up[5:7]), kv_win=tuple(up[7:9]),
                                return_block_idx=True)
    assert_close("o", o, ref_o, nsa_tolerance(torch.float32))
    assert torch.equal(idx, ref_idx)


def _check_bf16_real_size(lens, HQ, H, DK, DV, device):
    """bf16 decode against the float32 reference: each row's blocks are a valid top-n of the
    reference's scores (its own blocks but for near-ties), and ``o`` matches the reference given
    those blocks (the prefill ops at the row's position, its cache cut to its length)."""
    config = NSAConfig()
    q, k, v, gates, seq_lens, k_cmp, v_cmp, k_win, v_win = _real_size_inputs(lens, HQ, H, DK, DV, config, device)
    ins = (q, k, v, gates, seq_lens, config)
    kw = dict(kv_cmp=(k_cmp, v_cmp), kv_win=(k_win, v_win), return_block_idx=True)
    o, idx = nsa_decode(*ins, backend="triton", **kw)
    up = lambda t: t.float() if t.is_floating_point() else t  # noqa: E731
    _, ref_idx = nsa_decode(*map(up, ins[:5]), config, backend="reference",
                            kv_cmp=tuple(map(up, kw["kv_cmp"])), kv_win=tuple(map(up, kw["kv_win"])), return_block_idx=True)  # fmt: skip
    ref_o = [decode_row_reference(b, n, q, k, v, gates, k_cmp, v_cmp, k_win, v_win, idx, ref_idx, config)
             for b, n in enumerate(lens)]
    assert_close("o", o, torch.cat(ref_o), 1e-2)


@triton.jit
def _top_of_runs_probe(keys, out, RUN_LEVELS: tl.constexpr, NP_BITS: tl.constexpr):
    b_key = tl.load(keys + tl.arange(0, 1 << (RUN_LEVELS + NP_BITS)))
    tl.store(out + tl.arange(0, 1 << NP_BITS), top_of_sorted_runs(b_key, 1 << NP_BITS))


@pytest.mark.triton
@pytest.mark.parametrize("run_levels, np_bits", [(0, 2), (1, 1), (2, 4), (3, 2), (5, 4)])
def test_top_of_sorted_runs_is_the_top_k(run_levels, np_bits, nsa_device):
    """The merge of sorted runs (largest first in the first half of the runs, last in the second:
    what the score launch writes for the selection programs) gives the largest keys, largest
    first, as ``torch.topk``; distinct keys with -1 padding, as the candidates are."""
    gen = torch.Generator().manual_seed(run_levels * 10 + np_bits)
    runs, width = 1 << run_levels, 1 << np_bits
    keys = torch.randperm(10 * runs * width, generator=gen)[: runs * width].view(runs, width)
    keys[torch.rand(runs, width, generator=gen) < 0.2] = -1  # unused slots
    keys = keys.sort(dim=1, descending=True).values
    keys[(runs + 1) // 2:] = keys[(runs + 1) // 2:].flip(1)  # the second half, largest last (a single run: none)
    keys = keys.reshape(-1).to(nsa_device)
    out = torch.full((width,), -7, device=nsa_device, dtype=torch.int64)
    _top_of_runs_probe[(1,)](keys, out, RUN_LEVELS=run_levels, NP_BITS=np_bits)
    assert torch.equal(out.cpu(), keys.cpu().topk(width).values)


@pytest.mark.triton
def test_topn_is_one_bitonic_merge_where_the_candidates_fit_one_tile(monkeypatch, nsa_device):
    """The selection programs rank by one bitonic merge of the score tiles' sorted candidates
    wherever those fit one tile and something is left to rank: not when one score tile holds the
    whole row (its candidates are the top-n), not when the candidates span several tiles, not
    when asked for the rounds. Each launch's result still equals the reference's."""
    from nsa.ops.decode import kernel

    launched = spy_launches(monkeypatch, kernel, "decode_selected_fwd_kernel", "BITONIC", "RANKED", "ONE_TILE")
    config = SMALL
    q, gates, kv = _sequence(40, 4, 2, 16, 16, config, nsa_device)
    ref_o, ref_idx = _prefill(q, gates, kv, config)
    lens = torch.tensor([40, 21], device=nsa_device, dtype=torch.int32)
    launches = [
        ({"score_blocks": 2}, (True, False, True)),  # 5 blocks in 3 score tiles of 2: 12 candidate slots, one tile of 16
        ({}, (False, True, True)),  # one score tile of 64 blocks: ranked already
        ({"score_blocks": 2, "block_tile": 4}, (False, False, False)),  # candidates in tiles of 4
        ({"score_blocks": 2, "topn_bitonic": False}, (False, False, True)),
    ]
    for launch, expected in launches:
        o, idx = _rows_of_one_sequence(q, gates, kv, lens, config, splits=(1, 1, 2), **launch)
        assert launched[-1] == expected, launch
        assert_close("o", o[:, 0], ref_o[0, lens.long() - 1], 1e-4)
        assert torch.equal(idx[:, 0], ref_idx[0, lens.long() - 1]), launch


@pytest.mark.triton
def test_score_tiles_store_their_candidates_as_sorted_runs(nsa_device):
    """Where the selection programs merge runs, each score tile stores the same candidates as the
    rounds take (the tile's n best keys), but at their ranks: largest first where the tile index's
    bit `RUN_BIT` is 0, largest last where it is 1, the unused slots after the run or before it (what `top_of_sorted_runs`
    needs). Rows of 10 and 7 blocks in score tiles of 8, n = 4: the full tiles keep 4, the second
    tile of the first row its 2 blocks; the second row has no second tile to write."""
    config = SMALL
    q, gates, kv = _sequence(80, 4, 2, 16, 16, config, nsa_device)
    lens = torch.tensor([80, 53], device=nsa_device, dtype=torch.int32)
    tile_blocks, H = 8, kv["k"].shape[2]

    def candidates(**launch):
        with every_launch() as launches:
            _rows_of_one_sequence(q, gates, kv, lens, config, splits=(1, 1, 2), score_blocks=tile_blocks, **launch)
        score = next(kw for name, kw in launches if name == "decode_score_kernel")
        return score["args"][4].cpu(), score["SORTED"], score["RUN_BIT"]

    runs, sorted_runs, bit = candidates()
    plain, plain_sorted, _ = candidates(topn_bitonic=False)
    assert sorted_runs and not plain_sorted
    n = config.sel_count
    blocks = [(int(length) - 1) // config.sel_block + 1 for length in lens]  # visible blocks of each row
    checked = []
    for row_group in range(runs.shape[0]):
        for tile in range(-(-blocks[row_group // H] // tile_blocks)):
            run = runs[row_group, tile * n:(tile + 1) * n]
            kept = plain[row_group, tile * n:(tile + 1) * n]
            found = min(n, blocks[row_group // H] - tile * tile_blocks)
            assert int((kept >= 0).sum()) == found and int((run >= 0).sum()) == found
            largest_first = run if ((tile >> bit) & 1) == 0 else run.flip(0)
            assert torch.equal(largest_first[:found], kept[kept >= 0].sort(descending=True).values)
            assert bool((largest_first[found:] == -1).all())
            checked.append(found)
    assert checked == [4, 2, 4, 2, 4, 4]


# every block of a row is a candidate (n is past the longest row's 13 blocks) and none is forced,
# so the score launch's keys hold every block's score; 2 blocks a compressed tile of 8 tokens
SCORED = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=16, init_blocks=0, local_blocks=0, window=16)


@pytest.mark.triton
@pytest.mark.parametrize("score_mass", [True, False], ids=["block-masses", "logits"])
def test_score_launch_keys_hold_the_reference_block_scores(score_mass, nsa_device):
    """The scores the score launch packs into its keys equal the float64 reference's group block
    scores (spec Eqs. 8-10), from the compressed pass's logits or from its block masses. With the
    masses, compressed tiles of 8 tokens in 3 splits: each tile's masses are at its own max, and a
    tile's first block also takes the previous tile's tail at that tile's max (a tail weighted by
    its own tile's max moves a score by a few percent, which outputs and selected blocks on inputs
    this small did not show; it fails here)."""
    from nsa.ops.decode.topn import KEY_INDEX_MAX, KEY_SHIFT
    from nsa.ops.select.reference import block_scores

    # keys are score bits * KEY_SHIFT + (KEY_INDEX_MAX - block) (nsa.ops.decode.topn.pack_keys)
    shift, index_max = KEY_SHIFT.value, KEY_INDEX_MAX.value

    config, H, D = SCORED, 2, 16
    q, gates, kv = _sequence(200, 8, H, D, D, config, nsa_device)
    lens = torch.tensor([37, 90, 147, 200], device=nsa_device, dtype=torch.int32)
    with every_launch() as launches:
        _rows_of_one_sequence(q, gates, kv, lens, config, splits=(3, 1, 2), score_blocks=16, cmp_tile=8,
                              score_mass=score_mass)  # fmt: skip
    score = next(kw for name, kw in launches if name == "decode_score_kernel")
    assert score["MASS"] == score_mass
    keys = score["args"][4].cpu()  # [rows * H, candidates]
    want = block_scores(q.double(), kv["k_cmp"].double(), config, config.softmax_scale(D), 0)[0].cpu()  # [T, H, blocks]
    for r, length in enumerate(lens.tolist()):
        for h in range(H):
            row = keys[r * H + h]
            row = row[row >= 0]
            block = index_max - (row & index_max)
            got = (row // shift).to(torch.int32).view(torch.float32)
            assert sorted(block.tolist()) == list(range((length - 1) // config.sel_block + 1))
            torch.testing.assert_close(got.double(), want[length - 1, h, block], rtol=2e-6, atol=1e-9)


def test_score_cap_by_launch_size():
    """The score launch's cap on programs an SM: by default 20 (:func:`~nsa.ops.decode.kernel.default_score_cap`)
    only where the launch averages more than 12 programs an SM, fits 20 an SM and holds 32 tiles a
    row (batch 16 at 64k on an H200: 2048 programs), the points measured faster; not at batch 16, 32k
    (1024 programs), batch 32, 32k (2048 programs, 16 tiles a row) or batch 32, 64k (4096). The array
    (:func:`~nsa.ops.decode.kernel.score_cap_asm`) reserves an SM's shared memory over the cap; none at
    0, at 32 and over (the hardware's own), past one wave, or on the CPU; a small cap stops at 46 KiB
    (static and dynamic shared memory within 48)."""
    from nsa.ops.decode.kernel import (SCORE_CAP_FROM, SCORE_CAP_TILES, SCORE_PROGRAMS_PER_SM, default_score_cap,
                                       score_cap_asm)
    from nsa.ops.decode.score import reserve_shared_asm

    gpu = torch.device("cuda")
    with sized_as("h200") as facts:
        per_sm = facts.shared_memory + 1024
        assert (SCORE_PROGRAMS_PER_SM, SCORE_CAP_FROM, SCORE_CAP_TILES) == (20, 12, 32)
        assert default_score_cap(2048, 32, gpu) == 20
        assert default_score_cap(1024, 16, gpu) == 0 and default_score_cap(2048, 16, gpu) == 0
        assert default_score_cap(4096, 32, gpu) == 0
        assert default_score_cap(12 * 132, 32, gpu) == 0 and default_score_cap(12 * 132 + 1, 32, gpu) == 20
        assert default_score_cap(20 * 132, 32, gpu) == 20 and default_score_cap(20 * 132 + 1, 32, gpu) == 0
        assert score_cap_asm(2048, gpu, 20) == reserve_shared_asm(per_sm // 20 - 1536)
        assert score_cap_asm(1024, gpu, 16) == reserve_shared_asm(per_sm // 16 - 1536)
        assert score_cap_asm(20 * 132 + 1, gpu, 20) is None
        assert score_cap_asm(2048, gpu, 0) is None and score_cap_asm(2048, gpu, 32) is None
        assert score_cap_asm(64, gpu, 2) == reserve_shared_asm(46 * 1024)
        assert score_cap_asm(2048, torch.device("cpu"), 20) is None
    asm = reserve_shared_asm(10137)
    assert ".shared .align 16 .b8 nsa_score_cap[10137];" in asm and asm.count("$0") == 1 and asm.count("$1") == 1
    for bad in (0, 48 * 1024 + 1):
        with pytest.raises(ValueError, match="static shared array"):
            reserve_shared_asm(bad)


def test_score_cap_holds_its_shared_memory_when_compiled_for_hopper(tmp_path):
    """Compiled for sm_90 without a GPU (``scripts/sass_decode.sh``, Triton's own ptxas), the score
    kernel with ``CAP_ASM`` keeps the array that nothing reads: its static shared memory grows by the
    bytes reserved, which is what caps the programs an SM."""
    import os
    import pathlib
    import re
    import subprocess
    import sys

    from nsa.ops.decode.score import reserve_shared_asm

    root = pathlib.Path(__file__).resolve().parents[2]
    if not (pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("Triton's NVIDIA backend ships no cuobjdump here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_PATH=str(pathlib.Path(triton.__file__).parents[1]), PYTHON=sys.executable,
               TRITON_CACHE_DIR=str(tmp_path))

    def shared(cap_asm: str) -> int:
        run = subprocess.run(["bash", "scripts/sass_decode.sh", "score", "b16", f"CAP_ASM={cap_asm}"], cwd=root, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        return int(re.search(r"SHARED:(\d+)", run.stdout).group(1))

    assert shared(reserve_shared_asm(10137)) - shared("None") >= 10137


@pytest.mark.gpu
@pytest.mark.triton
def test_decode_score_cap_changes_nothing_but_placement(nsa_device):
    """The score launch's cap on programs an SM changes where they run, never what they compute:
    at batch 16 (the launches of a full GPU) every cap, and none, is bitwise the default (at 8k
    the smallest caps reserve the most shared memory: 4 an SM, 46 KiB a program)."""
    from nsa.ops.decode.kernel import decode_fwd

    config = NSAConfig()
    for lens in ([8192 - 37 * i for i in range(16)], [65536 - 501 * i for i in range(16)]):
        args = _real_size_inputs(lens, 64, 4, 128, 128, config, nsa_device)
        want = decode_fwd(*args, config, config.softmax_scale(128))
        for cap in (0, 4, 16, 31):
            got = decode_fwd(*args, config, config.softmax_scale(128), score_cap=cap)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"score_cap={cap} changed the result"


def test_score_warps_by_launch_size(monkeypatch):
    """132 SMs, paper defaults: the score launch keeps 4-warp programs up to four per SM
    (batch 1 at 64k, batch 16 up to 16k) and takes one warp beyond (batch 16 at 32k, 64k)."""
    from nsa.ops.decode import kernel

    monkeypatch.setattr(kernel, "_sm_count", lambda device: 132)
    config, cpu = NSAConfig(), torch.device("cpu")

    def programs(batch: int, context: int) -> int:  # 32-block score tiles, 4 KV groups a row
        return -(-config.num_sel_blocks(context) // 32) * batch * 4

    assert kernel.default_score_warps(programs(1, 65536), cpu) == 4
    assert kernel.default_score_warps(programs(16, 16384), cpu) == 4
    assert kernel.default_score_warps(programs(16, 32768), cpu) == 1
    assert kernel.default_score_warps(programs(16, 65536), cpu) == 1
    assert kernel.default_score_warps(4 * 132, cpu) == 4 and kernel.default_score_warps(4 * 132 + 1, cpu) == 1


def test_default_splits_by_batch(monkeypatch):
    """132 SMs, paper defaults, 64k: batch 1 hides latency with many short compressed splits
    and one block per selected program (at 16k also short window splits); batch 16 fills the GPU, so the compressed launch is
    one wave of 3 programs per SM in 3 stages and the window joins the selected launch (the
    measurements in ``default_splits``, ``fill_cmp_wave`` and ``fill_selected_split``). Past 3 *
    132 (row, group) pairs one split each no longer fits that wave, and the launch takes 4
    programs an SM in 2 stages. The selected launch (3 programs an SM) takes 4 blocks a program
    while that keeps it one wave (batch 16: 64 * (4 + 2) programs), else 8, and one window split
    where that saves it a wave (batch 32: 128 * (2 + 1) programs, one wave instead of two)."""
    from nsa.ops.decode import kernel

    monkeypatch.setattr(kernel, "_sm_count", lambda device: 132)
    config, cpu = NSAConfig(), torch.device("cpu")
    nc_cap = config.num_cmp(65536)
    assert kernel.default_splits(1 * 4, nc_cap, config, cpu) == (16, 4, 1)
    # shorter caches at batch 1: 16 compressed splits from 16k, the window's in 64-token splits
    # where the compressed ones are that short (16k); 8k keeps 8 and 4
    shorter = {context: kernel.default_splits(4, config.num_cmp(context), config, cpu) for context in (8192, 16384, 32768)}
    assert shorter == {8192: (8, 4, 1), 16384: (16, 8, 1), 32768: (16, 4, 1)}
    assert kernel.default_splits(16 * 4, nc_cap, config, cpu) == (6, 2, 4)
    assert kernel.default_splits(32 * 4, nc_cap, config, cpu) == (3, 1, 8)
    assert kernel.default_splits(64 * 4, nc_cap, config, cpu) == (1, 1, 8)
    assert kernel.default_splits(128 * 4, nc_cap, config, cpu) == (1, 1, 8)
    # the edges: 66 row-groups still fit one wave of 4-block programs (396 slots), 67 do not; 100
    # take one window split only once it saves a wave (3 * 100 <= 396 < 4 * 100)
    assert kernel.fill_selected_split(66, config, cpu) == (2, 4) and kernel.fill_selected_split(67, config, cpu) == (2, 8)
    assert kernel.fill_selected_split(99, config, cpu) == (2, 8) and kernel.fill_selected_split(100, config, cpu) == (1, 8)
    assert [kernel.fill_cmp_wave(rg, cpu) for rg in (64, 256, 396, 397, 528, 1024)] == [(3, 3)] * 3 + [(4, 2)] * 3
    assert not kernel._batch_fills_gpu(1 * 4, config, cpu) and kernel._batch_fills_gpu(16 * 4, config, cpu)
