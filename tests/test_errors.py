"""Bad input to the public ops raises ValueError/TypeError whose message names the argument.

Each case builds valid inputs, breaks one thing, and checks the exception type and that the
message names the offending argument (and, for shape errors, shows the shapes). "Different
devices" uses ``device="meta"`` tensors, so it runs on a CPU-only machine.
"""

from __future__ import annotations

import re
from typing import Callable, Dict

import pytest
import torch

import nsa
from nsa import ops

CFG = nsa.NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)
B, T, HQ, H, DK, DV = 2, 40, 4, 2, 8, 6


def _valid() -> Dict[str, object]:
    """Valid arguments of every op (float32, CPU), keyed by argument name."""
    k = torch.randn(B, T, H, DK)
    v = torch.randn(B, T, H, DV)
    return dict(
        q=torch.randn(B, T, HQ, DK),
        k=k,
        v=v,
        gates=torch.rand(B, T, HQ, 3),
        k_cmp=ops.mean_compress(k, CFG),
        v_cmp=ops.mean_compress(v, CFG),
        block_idx=torch.randint(-1, CFG.num_sel_blocks(T), (B, T, H, CFG.sel_count), dtype=torch.int32),
        x=k,
        config=CFG,
    )


CALLS: Dict[str, Callable[[Dict[str, object]], object]] = {
    "nsa_attention": lambda a: ops.nsa_attention(
        a["q"], a["k"], a["v"], a["gates"], a["config"], **{k: a[k] for k in ("kv_cmp", "kv_win", "q_offset") if k in a}
    ),
    "mean_compress": lambda a: ops.mean_compress(a["x"], a["config"]),
    "compressed_attention": lambda a: ops.compressed_attention(
        a["q"], a["k_cmp"], a["v_cmp"], a["config"], q_offset=a.get("q_offset", 0)
    ),
    "select_blocks": lambda a: ops.select_blocks(a["q"], a["k_cmp"], a["config"], q_offset=a.get("q_offset", 0)),
    "selected_attention": lambda a: ops.selected_attention(
        a["q"], a["k"], a["v"], a["block_idx"], a["config"], q_offset=a.get("q_offset", 0)
    ),
    "sliding_window_attention": lambda a: ops.sliding_window_attention(
        a["q"], a["k"], a["v"], a["config"], q_offset=a.get("q_offset", 0)
    ),
}
ATTENTION_OPS = ["nsa_attention", "selected_attention", "sliding_window_attention"]
Q_OPS = ATTENTION_OPS + ["compressed_attention", "select_blocks"]

# (ops, argument, replacement(valid args) -> new value, exception, patterns the message must match)
CASES = [
    # ---- wrong rank
    (Q_OPS, "q", lambda a: a["q"][0], ValueError, [r"\bq must have 4 dims, got 3", r"\[40, 4, 8\]"]),
    (ATTENTION_OPS, "k", lambda a: a["k"][..., None], ValueError, [r"\bk must have 4 dims, got 5", r"\[2, 40, 2, 8, 1\]"]),
    (ATTENTION_OPS, "v", lambda a: a["v"][0], ValueError, [r"\bv must have 4 dims"]),
    (["compressed_attention", "select_blocks"], "k_cmp", lambda a: a["k_cmp"][0], ValueError, [r"\bk_cmp must have 4 dims"]),
    (["compressed_attention"], "v_cmp", lambda a: a["v_cmp"][0], ValueError, [r"\bv_cmp must have 4 dims"]),
    (["mean_compress"], "x", lambda a: a["x"][0], ValueError, [r"\bx must have 4 dims, got 3"]),
    (["nsa_attention"], "gates", lambda a: a["gates"][0], ValueError, [r"\bgates must have 4 dims"]),
    (["selected_attention"], "block_idx", lambda a: a["block_idx"][0], ValueError, [r"\bblock_idx must have 4 dims"]),
    # ---- mismatched B / T / D / heads
    (ATTENTION_OPS, "k", lambda a: torch.randn(3, T, H, DK), ValueError, [r"batch sizes differ", r"\bq \[2, 40, 4, 8\]", r"\bk \[3, 40, 2, 8\]"]),
    (ATTENTION_OPS, "v", lambda a: torch.randn(B, T - 1, H, DV), ValueError, [r"\bk \[2, 40, 2, 8\] and v \[2, 39, 2, 6\] must have the same length"]),
    (ATTENTION_OPS, "v", lambda a: torch.randn(B, T, 1, DV), ValueError, [r"\bk \[2, 40, 2, 8\] and v \[2, 40, 1, 6\] must have the same number of heads"]),
    (ATTENTION_OPS, "k", lambda a: torch.randn(B, T, H, DK + 1), ValueError, [r"head dims differ", r"\bq \[2, 40, 4, 8\] has Dk=8", r"\bk \[2, 40, 2, 9\]"]),
    (["compressed_attention", "select_blocks"], "k_cmp", lambda a: torch.randn(B, 9, H, 4), ValueError, [r"head dims differ", r"\bk_cmp \[2, 9, 2, 4\]"]),
    (["compressed_attention"], "v_cmp", lambda a: torch.randn(B, 8, H, DV), ValueError, [r"\bk_cmp \[2, 9, 2, 8\] and v_cmp \[2, 8, 2, 6\] must have the same length"]),
    (["compressed_attention", "select_blocks"], "k_cmp", lambda a: torch.randn(1, 9, H, DK), ValueError, [r"batch sizes differ", r"\bk_cmp \[1, 9, 2, 8\]"]),
    (["nsa_attention"], "gates", lambda a: torch.rand(B, T, HQ, 2), ValueError, [r"\bgates must have shape \[B, T, HQ, 3\] = \[2, 40, 4, 3\]", r"\[2, 40, 4, 2\]"]),
    (["nsa_attention"], "gates", lambda a: torch.rand(B, T - 1, HQ, 3), ValueError, [r"\bgates must have shape", r"\[2, 39, 4, 3\]"]),
    (["selected_attention"], "block_idx", lambda a: a["block_idx"].repeat(1, 1, 2, 1), ValueError, [r"\bblock_idx must have shape \[B, Tq, H, count\]", r"\[2, 40, 4, 4\]"]),
    (["selected_attention"], "block_idx", lambda a: a["block_idx"][:, :, :, :0], ValueError, [r"\bblock_idx must have shape"]),
    # ---- HQ % H != 0
    (Q_OPS, "q", lambda a: torch.randn(B, T, 3, DK), ValueError, [r"query heads HQ=3", r"\bq \[2, 40, 3, 8\]", r"KV heads H=2", r"\[2, \d+, 2, 8\]"]),
    # ---- no query heads (the fuzzer's group of 0: a division by zero in a launcher, before)
    (Q_OPS, "q", lambda a: torch.randn(B, T, 0, DK), ValueError, [r"query heads HQ=0", r"positive multiple of KV heads H=2"]),
    # ---- dtypes
    (Q_OPS, "q", lambda a: a["q"].long(), TypeError, [r"\bq must be float16/bfloat16/float32/float64, got torch.int64"]),
    (ATTENTION_OPS, "k", lambda a: a["k"].int(), TypeError, [r"\bk must be float"]),
    (["mean_compress"], "x", lambda a: a["x"].to(torch.int16), TypeError, [r"\bx must be float.*torch.int16"]),
    (["nsa_attention"], "gates", lambda a: (a["gates"] > 0.5), TypeError, [r"\bgates must be float.*torch.bool"]),
    (ATTENTION_OPS, "v", lambda a: a["v"].double(), TypeError, [r"\bv has dtype torch.float64 but q has torch.float32"]),
    (["compressed_attention"], "v_cmp", lambda a: a["v_cmp"].half(), TypeError, [r"\bv_cmp has dtype torch.float16"]),
    (["selected_attention"], "block_idx", lambda a: a["block_idx"].float(), TypeError, [r"\bblock_idx must be int32/int64, got torch.float32"]),
    (Q_OPS, "q", lambda a: torch.randn(B, T, HQ, DK).tolist(), TypeError, [r"\bq must be a torch.Tensor, got list"]),
    # ---- block_idx values
    (["selected_attention"], "block_idx", lambda a: a["block_idx"].index_fill(1, torch.tensor([7]), 5), ValueError,
     [r"\bblock_idx values must lie in \[-1, 4\]", r"40 key positions", r"sel_block=8", r"max 5"]),
    (["selected_attention"], "block_idx", lambda a: a["block_idx"].index_fill(3, torch.tensor([0]), -2), ValueError,
     [r"\bblock_idx values must lie in \[-1, 4\]", r"min -2"]),
    # ---- devices
    (ATTENTION_OPS, "k", lambda a: a["k"].to("meta"), ValueError, [r"\bk is on meta but q is on cpu"]),
    (ATTENTION_OPS, "v", lambda a: a["v"].to("meta"), ValueError, [r"\bv is on meta but q is on cpu"]),
    (["compressed_attention", "select_blocks"], "k_cmp", lambda a: a["k_cmp"].to("meta"), ValueError, [r"\bk_cmp is on meta but q is on cpu"]),
    (["nsa_attention"], "gates", lambda a: a["gates"].to("meta"), ValueError, [r"\bgates is on meta but q is on cpu"]),
    (["selected_attention"], "block_idx", lambda a: a["block_idx"].to("meta"), ValueError, [r"\bblock_idx is on meta but q is on cpu"]),
    # ---- q_offset
    (Q_OPS, "q_offset", lambda a: -1, ValueError, [r"\bq_offset must be an int >= 0, got -1"]),
    (Q_OPS, "q_offset", lambda a: 2.0, ValueError, [r"\bq_offset must be an int >= 0, got 2.0"]),
    (Q_OPS, "q_offset", lambda a: True, ValueError, [r"\bq_offset must be an int >= 0, got True"]),
    (ATTENTION_OPS, "q_offset", lambda a: 1, ValueError, [r"queries cover positions 1..40 but k has only 40 positions", r"q_offset=1"]),
    # ---- config
    (list(CALLS), "config", lambda a: {"cmp_block": 8}, TypeError, [r"\bconfig must be an nsa.NSAConfig, got dict"]),
    # ---- per-branch (k, v) of nsa_attention
    (["nsa_attention"], "kv_cmp", lambda a: a["k_cmp"], TypeError, [r"\bkv_cmp must be a \(k, v\) pair of tensors, got Tensor"]),
    (["nsa_attention"], "kv_win", lambda a: (a["k"],), TypeError, [r"\bkv_win must be a \(k, v\) pair"]),
    (["nsa_attention"], "kv_cmp", lambda a: (a["k_cmp"], a["v_cmp"][:, :-1]), ValueError, [r"\bkv_cmp\[0\] \[2, 9, 2, 8\] and kv_cmp\[1\] \[2, 8, 2, 6\]"]),
    (["nsa_attention"], "kv_cmp", lambda a: (a["k_cmp"], a["v_cmp"][..., :4]), ValueError, [r"\bkv_cmp\[1\]", r"Dv=4", r"\bv\b.*Dv=6"]),
    (["nsa_attention"], "kv_win", lambda a: (a["k"][:1], a["v"][:1]), ValueError, [r"batch sizes differ", r"\bkv_win\[0\] \[1, 40, 2, 8\]"]),
    (["nsa_attention"], "kv_win", lambda a: (a["k"], a["v"].to("meta")), ValueError, [r"\bkv_win\[1\] is on meta"]),
]


def _params():
    for ops_, arg, make, exc, patterns in CASES:
        for op in ops_:
            yield pytest.param(op, arg, make, exc, patterns, id=f"{op}-{arg}-{patterns[0][:28]}")


@pytest.fixture(scope="module")
def valid() -> Dict[str, object]:
    return _valid()


@pytest.mark.parametrize("op", list(CALLS))
def test_valid_inputs_run(op, valid):
    """The baseline of every case below is accepted, so each error comes from the one change."""
    assert CALLS[op](valid) is not None


@pytest.mark.parametrize("op, arg, make, exc, patterns", list(_params()))
def test_bad_input_names_the_argument(op, arg, make, exc, patterns, valid, monkeypatch):
    monkeypatch.setenv("NSA_CHECK_INDICES", "on")  # whatever a profile says: check block_idx values
    args = dict(valid)
    args[arg] = make(args)
    with pytest.raises(exc) as info:
        CALLS[op](args)
    for pattern in patterns:
        assert re.search(pattern, str(info.value)), f"{pattern!r} not in {str(info.value)!r}"


def test_every_public_op_is_covered():
    # nsa_decode reads a preallocated cache, apply_rotary takes RoPE tables and rope_tables makes
    # them; their argument errors are tested beside their kernels, in tests/ops/test_decode_kernel.py
    # and tests/ops/test_rotary_kernel.py.
    assert set(CALLS) == set(ops.__all__) - {"combine_branches", "nsa_decode", "apply_rotary", "rope_tables"}


def test_index_check_follows_the_flag(monkeypatch):
    """NSA_CHECK_INDICES=off skips the value check (no sync on GPU); on/auto check CPU tensors."""
    args = _valid()
    args["block_idx"] = args["block_idx"].clone().fill_(7)
    for mode in ("on", "auto"):
        monkeypatch.setenv("NSA_CHECK_INDICES", mode)
        with pytest.raises(ValueError, match="block_idx values"):
            CALLS["selected_attention"](args)
    monkeypatch.setenv("NSA_CHECK_INDICES", "off")
    CALLS["selected_attention"](args)  # out-of-range blocks are trusted, not validated
