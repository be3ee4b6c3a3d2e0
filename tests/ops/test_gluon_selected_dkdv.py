"""The selected dK/dV's Gluon kernel (Hopper, ``NSA_GLUON_SELECTED_DKDV``) against the Triton one.

Gluon has no CPU interpreter, so the comparisons run on Hopper GPUs only; on CPU the kernel is
compiled for sm_90 with the installed Triton. The Triton kernel the GPU tests compare with is checked
against the float64 reference in ``test_selected_kernel.py``. Both fill the same ``dS`` buffer, which
starts poisoned with one value: a pair that one kernel writes and the other does not (a padding row's,
a pair the lists leave out) shows there, and so does a wrong one.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from _gluon_kernels import assert_compiles_for_hopper, record_launches, skip_without_hopper

from nsa.testing import assert_close


def test_gluon_selected_dkdv_compiles_for_hopper(tmp_path):
    """The kernel compiles for sm_90 with the installed Triton, no GPU needed (Gluon's API moves
    between releases). It fits Hopper's 227 KiB of shared memory a block, and the computing warpgroup
    takes the registers the copy warp gives up (256 and 24 of a launch at 168)."""
    assert_compiles_for_hopper("nsa.ops.selected.gluon_dkdv", tmp_path, computing=256, G=16, gated=True)


def test_gluon_selected_dkdv_takes_what_its_copies_and_tiles_allow():
    """Where the Gluon dK/dV applies, device aside (:func:`shapes_fit`): 16-bit contiguous inputs with
    128-wide heads, 8-64 heads a KV head in steps of 64 rows, blocks of 64 keys, keys in whole blocks;
    and only without the causal mask, with ``dS`` kept, never on CPU tensors."""
    from nsa.ops.selected import gluon_dkdv

    def case(T=64, TK=128, HQ=16, H=1, D=128, dtype=torch.bfloat16, sel_block=64, bq=None, transpose=False):
        q = torch.randn(1, T, HQ, D, dtype=dtype)
        q = q.transpose(1, 2).contiguous().transpose(1, 2) if transpose else q
        k = torch.randn(1, TK, H, D, dtype=dtype)
        return gluon_dkdv.shapes_fit(q, k, k, q, sel_block, bq or 64 // (HQ // H))

    assert case() and case(HQ=64, H=8) and case(HQ=64) and case(HQ=32, H=4) and case(dtype=torch.float16)
    assert case(T=61)  # queries need not fill a step: padding rows copy the last real one's
    assert not case(D=64)
    assert not case(HQ=4, H=1)  # 4 heads a KV head: 16 queries a step
    assert not case(bq=2)  # 32-row steps
    assert not case(sel_block=32)
    assert not case(TK=100)  # the last block's copy would read past the keys
    assert not case(dtype=torch.float32)
    assert not case(transpose=True)
    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 128, 1, 128, dtype=torch.bfloat16)
    assert not gluon_dkdv.fits(q, k, k, q, 64, 4, True, False)


@pytest.mark.gpu
@pytest.mark.parity
@pytest.mark.parametrize(
    "B, T, HQ, H, q_offset, gated, qseg",
    [
        (1, 4096, 64, 4, 0, True, 0),
        (2, 2000, 16, 1, 48, False, 256),
        (1, 2048, 32, 4, 64, True, 0),
        (1, 1111, 64, 1, 89, False, 96),
        (1, 8192, 64, 4, 0, True, 0),
    ],
    ids=["T4096-G16-gated", "B2-T2000-G16-offset48-256-a-program", "T2048-G8-gated-offset64",
         "T1111-G64-offset89-96-a-program", "T8192-G16-gated"],
)
def test_gluon_selected_dkdv_matches_triton(B, T, HQ, H, q_offset, gated, qseg, nsa_device, monkeypatch):
    """dk, dv and the stored ``dS`` of the selected dK/dV with the Gluon kernel equal the Triton
    kernel's within bf16 rounding (both sum each block's queries in the same order; the products round
    differently), with a batch, gates, ``q_offset``, 8-64 heads a KV head, owners of one segment and of
    many (the reduction's partials), lists with repeats, -1 and future blocks, and segments that end
    inside a step; and the Gluon kernel did run."""
    skip_without_hopper(nsa_device, "the Gluon dK/dV")
    from nsa import NSAConfig
    from nsa.ops.selected import gluon_dkdv
    from nsa.ops.selected.kernel import BWD_TILES, selected_bwd_dkdv, selected_fwd

    calls = record_launches(monkeypatch, gluon_dkdv, "selected_bwd_dkdv_gluon")
    config = NSAConfig()
    TK, count, sel_block = q_offset + T + (-(q_offset + T)) % 64, 16, config.sel_block
    q = torch.randn(B, T, HQ, 128, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(B, TK, H, 128, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    block_idx = torch.randint(-1, TK // sel_block, (B, T, H, count), device=nsa_device, dtype=torch.int32)
    block_idx[..., 0] = 0  # every query sees a key
    scale = config.softmax_scale(128)
    o, lse = selected_fwd(q, k, v, block_idx, sel_block, scale, q_offset)
    do = torch.randn_like(o)
    gate = torch.rand(B, T, HQ, device=nsa_device) if gated else None
    delta = (o.float() * do.float()).sum(-1)
    cfg = dict(BWD_TILES["dkdv"], **({"QSEG": qseg} if qseg else {}))
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("NSA_GLUON_SELECTED_DKDV", flag)
        ds = torch.full((B, T, H, count, HQ // H, sel_block), 7.0, device=nsa_device, dtype=torch.bfloat16)
        # skip_local 2: the window's share, as in the NSA prefill (no causal mask)
        dk, dv = selected_bwd_dkdv(q, k, v, block_idx, do, lse, delta, sel_block, scale, q_offset, cfg, gate,
                                   skip_local=2, ds=ds)
        out[flag] = dk, dv, ds
    assert calls == [1]
    for name, got, want in zip(("dk", "dv", "dS"), out["1"], out["0"]):
        assert torch.isfinite(got).all(), name
        assert_close(f"{name}, Gluon dK/dV against Triton's", got, want, 2e-3)
    assert torch.equal(out["1"][2] == 7.0, out["0"][2] == 7.0), "the kernels wrote different dS pairs"
