"""The compressed forward's pass 1 in Gluon (Hopper, ``NSA_GLUON_COMPRESSED_PASS1``) against the
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

from _gluon_kernels import assert_compiles_for_hopper, hopper_sass, record_launches, skip_without_hopper

from nsa import NSAConfig
from nsa.testing import assert_close


def test_gluon_pass1_compiles_for_hopper(tmp_path):
    """The kernel compiles for sm_90 with the installed Triton, no GPU needed (Gluon's API moves
    between releases). It fits Hopper's 227 KiB of shared memory a block, and its partitions take the
    registers its launch gives them (computing warpgroups 240, the copy warp 24)."""
    assert_compiles_for_hopper("nsa.ops.compressed.gluon_pass1", tmp_path, G=16)


def test_gluon_pass1_softmax_runs_beside_p_v(tmp_path):
    """In each computing warpgroup's steps, the softmax's exponentials lie between the wait for the
    scores (``P V`` left in flight: ``DEPBAR.LE gsb0, 0x1``) and the wait for ``P V`` (``0x0``), as
    compiled for sm_90: ptxas hoists a wgmma wait to the top of its block unless a shared-memory store
    stands before it, which would put the wait before the exponentials and leave no product beside them."""
    lines = [line.split("*/", 1)[1].strip() for line in hopper_sass("nsa.ops.compressed.gluon_pass1", tmp_path, G=16)
             .splitlines() if line.strip().startswith("/*") and "*/" in line]
    steps = [i for i, line in enumerate(lines) if line.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1")]
    assert len(steps) == 2  # one steps' loop a computing warpgroup
    for i in steps:
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
        exps = sum(line.startswith("MUFU.EX2") for line in lines[i:end])
        assert exps >= 64, f"{exps} exponentials between the waits (a 64 x 128 tile needs 64 a thread)"


def test_gluon_pass1_takes_what_its_copies_allow():
    """Where the Gluon pass 1 applies, device aside (:func:`shapes_fit`): 16-bit contiguous inputs
    with 128-wide heads and 8-64 heads a KV head; and never on CPU tensors."""
    from nsa.ops.compressed import gluon_pass1

    def case(HQ=16, H=1, D=128, dtype=torch.bfloat16, transpose=False):
        q = torch.randn(1, 64, HQ, D, dtype=dtype)
        q = q.transpose(1, 2).contiguous().transpose(1, 2) if transpose else q
        k = torch.randn(1, 3, H, D, dtype=dtype)
        return gluon_pass1.shapes_fit(q, k, k)

    assert case() and case(HQ=64, H=8) and case(HQ=64) and case(HQ=32, H=4) and case(dtype=torch.float16)
    assert not case(D=64)
    assert not case(HQ=12, H=1)
    assert not case(HQ=4, H=1)
    assert not case(dtype=torch.float32)
    assert not case(transpose=True)
    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    assert not gluon_pass1.fits(q, q[:, :3, :1], q[:, :3, :1])


@pytest.mark.gpu
@pytest.mark.parity
@pytest.mark.parametrize(
    "B, T, HQ, H, q_offset",
    [(1, 20480, 64, 4, 0), (2, 17001, 16, 1, 0), (1, 18000, 32, 4, 300), (1, 16900, 64, 1, 1000)],
    ids=["T20480-G16", "B2-T17001-G16", "T18000-G8-offset300", "T16900-G64-offset1000"],
)
def test_gluon_pass1_matches_triton(B, T, HQ, H, q_offset, nsa_device, monkeypatch):
    """``o``, ``lse`` and the selection of the compressed forward with the Gluon pass 1 equal the
    Triton launch's (o and lse within bf16 rounding; the selection reads the log2-domain lse pass 1
    leaves, so a wrong one would move it), past 16k tokens where pass 2 runs apart, with a batch,
    ``q_offset``, 8-64 heads a KV head and lengths that end inside a query tile; and the Gluon kernel
    did run."""
    skip_without_hopper(nsa_device, "the Gluon pass 1")
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import gluon_pass1

    calls = record_launches(monkeypatch, gluon_pass1, "compressed_pass1_gluon")
    config = NSAConfig()
    nc = config.num_cmp(q_offset + T)
    q = torch.randn(B, T, HQ, 128, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(B, nc, H, 128, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    scale = config.softmax_scale(128)
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("NSA_GLUON_COMPRESSED_PASS1", flag)
        out[flag] = compressed_fwd(q, k, v, config, scale, q_offset, select=True)
    assert len(calls) == 1
    (o, lse, idx), (o_want, lse_want, idx_want) = out["1"], out["0"]
    assert torch.isfinite(o).all()
    assert_close("o, Gluon pass 1 against Triton's", o, o_want, 2e-3)
    seen = torch.isfinite(lse_want)  # -inf where a query sees no compressed token yet
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close("lse, Gluon pass 1 against Triton's", lse[seen], lse_want[seen], 2e-3)
    agree = (idx == idx_want).float().mean().item()
    assert agree > 0.999, f"the selections agree on {agree:.4%} of their entries"


def test_short_walk_tokens_follow_the_gluon_passes(monkeypatch):
    """Where pass 1 and the scoring pass would both run as Gluon kernels the fused launch of short
    walks takes only queries that see at most ``GLUON_SHORT_TOKENS`` compressed tokens, elsewhere
    ``SHORT_TOKENS`` (the Triton launches' own tiles); never the Gluon limit on CPU tensors."""
    from nsa.ops._triton import compressed_fwd as module
    from nsa.ops.compressed import gluon_pass1, gluon_scores

    assert module.GLUON_SHORT_TOKENS < module.SHORT_TOKENS
    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 3, 1, 128, dtype=torch.bfloat16)
    config = NSAConfig()
    assert module.short_walk_tokens(q, k, k, config) == module.SHORT_TOKENS
    for first, second in ((True, True), (True, False), (False, True)):
        monkeypatch.setattr(gluon_pass1, "fits", lambda *args, fit=first: fit)
        monkeypatch.setattr(gluon_scores, "fits", lambda *args, fit=second: fit)
        want = module.GLUON_SHORT_TOKENS if first and second else module.SHORT_TOKENS
        assert module.short_walk_tokens(q, k, k, config) == want


@pytest.mark.gpu
@pytest.mark.parity
@pytest.mark.parametrize("T, gluon", [(7999, False), (9000, True), (12000, True), (16384, True)],
                         ids=["T7999-fused", "T9000", "T12000", "T16384"])
def test_gluon_passes_take_the_longer_short_walks(T, gluon, nsa_device, monkeypatch):
    """On Hopper the compressed forward runs its passes apart as Gluon kernels from
    ``GLUON_SHORT_TOKENS`` compressed tokens on (9k-16k tokens here), where the Triton launches keep
    the fused launch up to ``SHORT_TOKENS``: its ``o``, ``lse`` and selection equal the fused launch's
    (within bf16 rounding; near-ties aside); below the limit (8k) the fused launch runs either way."""
    skip_without_hopper(nsa_device, "the Gluon passes")
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import gluon_pass1

    calls = record_launches(monkeypatch, gluon_pass1, "compressed_pass1_gluon")
    config = NSAConfig()
    nc = config.num_cmp(T)
    q = torch.randn(1, T, 64, 128, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, nc, 4, 128, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    scale = config.softmax_scale(128)
    out = {}
    for flag in ("0", "1"):  # pass 1 in Triton: both passes' limit is SHORT_TOKENS, the launch fused
        monkeypatch.setenv("NSA_GLUON_COMPRESSED_PASS1", flag)
        out[flag] = compressed_fwd(q, k, v, config, scale, 0, select=True)
    assert len(calls) == int(gluon)
    (o, lse, idx), (o_want, lse_want, idx_want) = out["1"], out["0"]
    assert_close("o, the passes apart against the fused launch", o, o_want, 2e-3)
    seen = torch.isfinite(lse_want)
    assert torch.equal(torch.isfinite(lse), seen)
    assert_close("lse, the passes apart against the fused launch", lse[seen], lse_want[seen], 2e-3)
    agree = (idx == idx_want).float().mean().item()
    assert agree > 0.999, f"the selections agree on {agree:.4%} of their entries"
