"""The compressed dK/dV's Gluon kernel (Hopper, ``NSA_GLUON_COMPRESSED_DKDV``) against the Triton one.

Gluon has no CPU interpreter, so the comparisons run on Hopper GPUs only; on CPU the kernel is
compiled for sm_90 with the installed Triton. The Triton path the GPU tests compare with is checked
against the float64 reference in ``test_compressed_kernel.py``; here both paths take ``delta`` (as training passes it), so that the dK/dV kernel leaves ``dS`` and the dQ reads it:
a ``dS`` tile that the Gluon kernel left unwritten would reach ``dq`` as NaN (``torch.empty`` is
NaN-filled in tests), and a wrong one would move it.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from _gluon_kernels import assert_compiles_for_hopper, record_launches, skip_without_hopper

from nsa import NSAConfig
from nsa.testing import assert_close


def test_gluon_dkdv_compiles_for_hopper(tmp_path):
    """The kernel compiles for sm_90 with the installed Triton, no GPU needed: Gluon's API moves
    between releases (Triton 3.9 renamed the TMA copies), and the GPU tests run only where a Hopper
    GPU is. It fits Hopper's 227 KiB of shared memory a block, and its partitions take the registers
    its launch gives them (computing warpgroups 240, the copy warp 24). Compiled in a fresh Triton
    cache, so that a cached build cannot stand in for the compile."""
    assert_compiles_for_hopper("nsa.ops.compressed.gluon_dkdv", tmp_path, G=16, gated=True)


def test_gluon_dkdv_takes_what_its_copies_and_tiles_allow():
    """Where the Gluon dK/dV applies, device aside (:func:`shapes_fit`): 16-bit contiguous inputs
    with 128-wide heads, 8-64 heads a KV head in the Triton kernel's Hopper tiles (64 rows, 128
    tokens), whole query tiles; anything else runs the Triton kernel. And never on CPU tensors."""
    from nsa.ops.compressed import gluon_dkdv

    def case(T=64, HQ=16, H=1, D=128, dtype=torch.bfloat16, tiles=None, transpose=False):
        q = torch.randn(1, T, HQ, D, dtype=dtype)
        q = q.transpose(1, 2).contiguous().transpose(1, 2) if transpose else q
        k = torch.randn(1, 3, H, D, dtype=dtype)
        G = HQ // H
        return gluon_dkdv.shapes_fit(q, k, k, q, tiles or dict(GP=G, BT=64 // G, BN=128))

    assert case() and case(HQ=64, H=8) and case(HQ=64) and case(dtype=torch.float16)
    assert not case(D=64)
    assert not case(HQ=12, H=1, tiles=dict(GP=16, BT=4, BN=128))  # 12 heads pad to 16 rows
    assert not case(HQ=4, tiles=dict(GP=4, BT=16, BN=128))  # 4 heads a KV head
    assert not case(T=62)  # the last query tile not whole
    assert not case(tiles=dict(GP=16, BT=4, BN=64))
    assert not case(dtype=torch.float32)
    assert not case(transpose=True)
    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 3, 1, 128, dtype=torch.bfloat16)
    assert not gluon_dkdv.fits(q, k, k, q, dict(GP=16, BT=4, BN=128), True)


@pytest.mark.gpu
@pytest.mark.parity
@pytest.mark.parametrize(
    "B, T, HQ, H, q_offset, gated, max_splits",
    [
        (1, 4096, 64, 4, 0, True, None),
        (2, 3004, 16, 1, 0, False, None),
        (1, 2052, 32, 1, 100, True, 3),
        (1, 1540, 64, 1, 37, False, 1),
        (1, 8192, 64, 4, 0, True, None),
    ],
    ids=["T4096-G16-gated", "B2-T3004-G16", "T2052-G32-offset100-3-chunks", "T1540-G64-offset37-unsplit",
         "T8192-G16-gated"],
)
def test_gluon_dkdv_matches_triton(B, T, HQ, H, q_offset, gated, max_splits, nsa_device, monkeypatch):
    """dq, dk and dv of the compressed backward with the Gluon dK/dV equal the Triton dK/dV's within
    bf16 rounding (both sum each token's query tiles in the same order; the products round
    differently), with a batch, gates, ``q_offset``, query chunks or none, 8-64 heads a KV group, and
    token counts that end inside a tile; and the Gluon kernel did run."""
    skip_without_hopper(nsa_device, "the Gluon dK/dV")
    from nsa.ops._triton.compressed_fwd import compressed_fwd
    from nsa.ops.compressed import gluon_dkdv, kernel

    calls = record_launches(monkeypatch, gluon_dkdv, "compressed_bwd_dkdv_gluon")
    config = NSAConfig()
    nc = config.num_cmp(q_offset + T)
    q = torch.randn(B, T, HQ, 128, device=nsa_device, dtype=torch.bfloat16)
    k, v = (torch.randn(B, nc, H, 128, device=nsa_device, dtype=torch.bfloat16) for _ in range(2))
    scale = config.softmax_scale(128)
    o, lse, _ = compressed_fwd(q, k, v, config, scale, q_offset)
    do = torch.randn_like(o)
    gate = torch.rand(*o.shape[:3], device=nsa_device) if gated else None
    delta = (o.float() * do.float()).sum(-1)
    monkeypatch.setenv("NSA_COMPRESSED_DQ_FROM_DS_MIB", "16384")
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("NSA_GLUON_COMPRESSED_DKDV", flag)
        out[flag] = kernel.compressed_bwd(q, k, v, o, lse, do, None, config, scale, q_offset, delta=delta,
                                          gate=gate, max_splits=max_splits)
    assert calls == [1]
    for name, got, want in zip(("dq", "dk", "dv"), out["1"], out["0"]):
        assert torch.isfinite(got).all(), name
        assert_close(f"{name}, Gluon dK/dV against Triton's", got, want, 2e-3)
