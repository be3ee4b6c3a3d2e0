"""Block selection (spec Eqs. 8-11, pinned): hand-computed cases and a loop-by-loop oracle.

The hand-computed cases steer ``p_cmp`` directly: with ``scale = 1`` and queries
``e_0``/``e_1``, the logit of compressed token ``i`` for head 0 is ``k_cmp[i, 0]`` and for
head 1 is ``k_cmp[i, 1]`` exactly. A logit of -1000 gives a probability of exactly 0
in float64, so the chosen tokens' probabilities are exact dyadic numbers and ties are exact.
"""

from __future__ import annotations

import math
from typing import Dict, Sequence

import pytest
import torch
from _dense import spec_block_scores, spec_top_n

import nsa
from nsa import ops
from nsa.ops.select.reference import overlap_weights
from nsa.testing import assert_valid_selection

# The default ratios (l = 2d, l' = 4d) at a quarter of the size: token i covers [4i, 4i + 8),
# block j covers [16j, 16j + 16), so tokens 4j, 4j+1, 4j+2 lie in block j and 4j-1, 4j+3 straddle.
CFG = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4, window=16, scale=1.0)
OFF = -1000.0  # exp(OFF) underflows to exactly 0 in float64


def _select(t: int, logits: Sequence[Dict[int, float]], cfg: nsa.NSAConfig = CFG, num_cmp=None):
    """Blocks chosen for one query at position ``t``, one KV group of ``len(logits)`` heads.

    ``logits[h]`` maps compressed token -> logit for head ``h`` (others get ``OFF``).
    """
    G = len(logits)
    nc = cfg.num_cmp(t + 1) if num_cmp is None else num_cmp
    k_cmp = torch.full((1, nc, 1, G), OFF, dtype=torch.float64)
    for h, row in enumerate(logits):
        for i, x in row.items():
            k_cmp[0, i, 0, h] = x
    q = torch.eye(G, dtype=torch.float64)[None, None]  # [1, 1, G, G]: head h reads column h
    return ops.select_blocks(q, k_cmp, cfg, q_offset=t)[0, 0, 0].tolist()


def test_overlap_weights_with_the_defaults():
    """Tokens 4j..4j+2 count fully towards block j; 4j-1 and 4j+3 count one half each."""
    cfg = nsa.NSAConfig()
    W = overlap_weights(24, 6, cfg, "cpu", torch.float64)  # [Nc, blocks]
    for j in range(6):
        for i in range(24):
            want = {4 * j: 1.0, 4 * j + 1: 1.0, 4 * j + 2: 1.0, 4 * j - 1: 0.5, 4 * j + 3: 0.5}.get(i, 0.0)
            assert W[i, j].item() == want, (i, j)


@pytest.mark.parametrize(
    "cfg",
    [
        pytest.param(nsa.NSAConfig(), id="defaults"),
        pytest.param(nsa.NSAConfig(cmp_block=12, cmp_stride=4, sel_block=8, sel_count=3), id="l>l'"),
        pytest.param(nsa.NSAConfig(cmp_block=6, cmp_stride=6, sel_block=18, sel_count=3), id="l=d"),
    ],
)
def test_overlap_weights_conserve_mass(cfg):
    """Each compressed token spreads exactly its own mass (rows sum to 1), by interval length."""
    nc, nb = 20, cfg.num_sel_blocks((20 - 1) * cfg.cmp_stride + cfg.cmp_block)
    W = overlap_weights(nc, nb, cfg, "cpu", torch.float64)
    assert torch.equal(W.sum(1), torch.ones(nc, dtype=torch.float64))
    for i in range(nc):
        for j in range(nb):
            lo, hi = max(i * cfg.cmp_stride, j * cfg.sel_block), min(i * cfg.cmp_stride + cfg.cmp_block, (j + 1) * cfg.sel_block)
            assert W[i, j].item() == max(0, hi - lo) / cfg.cmp_block
    p_cmp = torch.softmax(torch.randn(7, nc, dtype=torch.float64), -1)
    assert torch.allclose((p_cmp @ W).sum(-1), torch.ones(7, dtype=torch.float64), rtol=0, atol=1e-14)


def test_forced_blocks_win_over_any_score():
    """At t = 127 (own block 7): blocks 0, 6, 7 are forced even with the lowest scores; the one
    free slot goes to the block holding all the mass."""
    t, nc = 127, CFG.num_cmp(128)
    logits = {i: OFF for i in range(nc)}
    logits.update({13: 0.0})  # token 13 = 4*3 + 1 lies in block 3 only
    assert _select(t, [logits]) == [0, 3, 6, 7]


@pytest.mark.parametrize(
    "init, local, want",
    [
        pytest.param(2, 1, [0, 1, 3, 7], id="init2-local1"),
        pytest.param(0, 3, [3, 5, 6, 7], id="init0-local3"),
        pytest.param(1, 0, [0, 2, 3, 4], id="init1-local0"),
        pytest.param(0, 0, [1, 2, 3, 4], id="init0-local0"),
    ],
)
def test_forced_block_counts(init, local, want):
    """Mass on blocks 3 > 4 > 2 > 1 (block 0 and 5..7 get none): forced ones, then the best."""
    cfg = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4, init_blocks=init,
                        local_blocks=local, window=16, scale=1.0)
    logits = {13: math.log(8.0), 17: math.log(4.0), 9: math.log(2.0), 5: 0.0}
    assert _select(127, [logits], cfg) == want


def test_fewer_visible_blocks_than_sel_count():
    """With |V| <= n every visible block is chosen, however little mass it has, padded with -1."""
    assert _select(40, [{0: 0.0}]) == [0, 1, 2, -1]  # t // 16 = 2: blocks 0, 1, 2
    assert _select(5, [{}], num_cmp=0) == [0, -1, -1, -1]  # no compressed token yet
    assert _select(63, [{1: 0.0}]) == [0, 1, 2, 3]  # exactly n visible blocks


def test_ties_go_to_the_lower_block():
    """Uniform p_cmp over 32 tokens (exact in float64): blocks 1..6 all score 4/32. With one
    free slot block 1 wins; with three, blocks 1, 2, 3."""
    t = 131  # Nc = 32, own block 8: forced {0, 7, 8}
    uniform = {i: 0.0 for i in range(CFG.num_cmp(t + 1))}
    assert CFG.num_cmp(t + 1) == 32
    assert _select(t, [uniform]) == [0, 1, 7, 8]
    wide = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=6, window=16, scale=1.0)
    assert _select(t, [uniform], wide) == [0, 1, 2, 3, 7, 8]


def test_ties_between_high_blocks_skip_lower_weaker_blocks():
    """Blocks 2 and 5 tie at 3/8 each, block 1 has 1/8: one slot picks 2, two slots pick 2 and 5."""
    t = 131
    tied = {8: 0.0, 9: 0.0, 10: 0.0, 20: 0.0, 21: 0.0, 22: 0.0, 5: 0.0, 29: 0.0}  # p = 1/8 each
    assert _select(t, [tied]) == [0, 2, 7, 8]
    five = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=5, window=16, scale=1.0)
    assert _select(t, [tied], five) == [0, 2, 5, 7, 8]


@pytest.mark.parametrize("ratio, want", [(2.02, 4), (1.98, 3)])
def test_straddling_token_counts_half(ratio, want):
    """Token 19 = 4*4 + 3 = 4*5 - 1 gives half its mass to block 4 and half to block 5 (an exact
    tie, so block 4 stands for both); token 13 = 4*3 + 1 gives all of its mass to block 3.
    Block 4 beats block 3 iff p[19] / 2 > p[13], i.e. iff the ratio of their masses exceeds 2."""
    got = _select(127, [{19: math.log(ratio), 13: 0.0}])  # t = 127: forced {0, 6, 7}, one free slot
    assert got == [0, want, 6, 7]


def test_future_compressed_tokens_do_not_enter_the_softmax():
    """p_cmp is normalised over the visible tokens only (0..30 at t = 127). Head 0 puts 0.9 on
    block 3, head 1 puts 1.0 on block 4: block 4 wins. Were head 1's large logits on tokens that
    are not complete yet (31, 39) part of its softmax, its block-4 mass would shrink and block 3 win."""
    head0 = {13: math.log(0.9), 9: math.log(0.1)}
    head1 = {17: 0.0, 31: 5.0, 39: 6.0}
    assert _select(127, [head0, head1], num_cmp=40) == [0, 4, 6, 7]
    assert _select(127, [head0, {17: 0.0}], num_cmp=40) == [0, 4, 6, 7]


def test_group_reduction_sums_heads():
    """Head 0 prefers block 3 (0.6 vs 0.4), head 1 prefers block 4 (0.3 vs 0.7): the group sum
    picks block 4 for both heads, while head 0 alone would pick block 3."""
    t = 127
    head0 = {13: math.log(0.6), 17: math.log(0.4)}
    head1 = {13: math.log(0.3), 17: math.log(0.7)}
    assert _select(t, [head0]) == [0, 3, 6, 7]
    assert _select(t, [head1]) == [0, 4, 6, 7]
    assert _select(t, [head0, head1]) == [0, 4, 6, 7]
    assert _select(t, [head1, head0]) == [0, 4, 6, 7]  # the order of heads does not matter


def test_selection_is_per_kv_group():
    """Two KV groups with opposite preferences choose independently; output is int32, ascending."""
    cfg, t = CFG, 127
    nc = cfg.num_cmp(t + 1)
    k_cmp = torch.full((1, nc, 2, 1), OFF, dtype=torch.float64)
    k_cmp[0, 13, 0, 0] = 0.0  # group 0: block 3
    k_cmp[0, 17, 1, 0] = 0.0  # group 1: block 4
    q = torch.ones(1, 1, 4, 1, dtype=torch.float64)  # HQ = 4, H = 2, G = 2
    idx = ops.select_blocks(q, k_cmp, cfg, q_offset=t)
    assert idx.dtype == torch.int32 and idx.shape == (1, 1, 2, 4)
    assert idx[0, 0].tolist() == [[0, 3, 6, 7], [0, 4, 6, 7]]


# ---------------------------------------------------------------- against a loop-by-loop oracle


ORACLE_CASES = [  # B, T, H, G, q_offset, config
    pytest.param(2, 31, 2, 1, 0, nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16),
                 id="B2-T31-G1"),
    pytest.param(2, 77, 1, 2, 0, nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=3, window=16),
                 id="B2-T77-G2"),
    pytest.param(2, 33, 2, 4, 40, nsa.NSAConfig(cmp_block=4, cmp_stride=4, sel_block=8, sel_count=5,
                                                init_blocks=2, local_blocks=1, window=8), id="B2-T33-G4-off40"),
    pytest.param(1, 57, 1, 16, 0, nsa.NSAConfig(cmp_block=8, cmp_stride=2, sel_block=4, sel_count=6,
                                                init_blocks=0, local_blocks=0, window=8), id="B1-T57-G16-free"),
    pytest.param(2, 13, 1, 2, 117, nsa.NSAConfig(cmp_block=16, cmp_stride=8, sel_block=8, sel_count=4,
                                                 local_blocks=3, window=8), id="B2-T13-G2-l>l'-off117"),
]


@pytest.mark.parity
@pytest.mark.parametrize("B, T, H, G, q_offset, cfg", ORACLE_CASES)
def test_select_blocks_matches_spec_oracle(B, T, H, G, q_offset, cfg, nsa_device):
    """select_blocks equals a per-query loop over the spec's text, except where the oracle's
    weakest chosen and strongest rejected scores are within 1e-6 (float32 kernels may break
    near-ties), and then it is still a top-n of the oracle's scores."""
    dtype = torch.float64 if torch.device(nsa_device).type == "cpu" else torch.float32
    q = torch.randn(B, T, H * G, 8, dtype=torch.float64)
    k_cmp = torch.randn(B, cfg.num_cmp(q_offset + T), H, 8, dtype=torch.float64)
    got = ops.select_blocks(q.to(nsa_device, dtype), k_cmp.to(nsa_device, dtype), cfg, q_offset=q_offset).cpu()
    assert got.dtype == torch.int32 and got.shape == (B, T, H, cfg.sel_count)
    nblk = (q_offset + T - 1) // cfg.sel_block + 1
    scores = torch.full((B, T, H, nblk), float("-inf"), dtype=torch.float64)
    want = torch.empty(B, T, H, cfg.sel_count, dtype=torch.int32)
    for b in range(B):
        for i in range(T):
            t = q_offset + i
            for g in range(H):
                row = spec_block_scores(q[b, i, g * G : (g + 1) * G], k_cmp[b, :, g], t, cfg)
                scores[b, i, g, : len(row)] = torch.tensor(row, dtype=torch.float64)
                want[b, i, g] = torch.tensor(spec_top_n(row, t, cfg), dtype=torch.int32)
    differ = assert_valid_selection(got, want, scores, cfg, q_offset=q_offset, eps=1e-6)
    assert differ <= 0.02 * B * T * H
