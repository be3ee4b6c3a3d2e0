"""The window dK/dV's Gluon kernel (Hopper, ``NSA_GLUON_WINDOW_DKDV``) against the Triton one.

Gluon has no CPU interpreter, so the comparisons run on Hopper GPUs only; on CPU the kernel is
compiled for sm_90 with the installed Triton. The Triton kernel the GPU tests compare with is checked
against the float64 reference in ``test_window_kernel.py`` and, inside the NSA prefill (the selected
branch's local blocks, gates, gradients added to the selected branch's), in
``test_nsa_attention_kernel.py``.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from _gluon_kernels import WINDOW_ALONE, WINDOW_IN_NSA, assert_compiles_for_hopper, window_grads_flag_off_and_on


def test_gluon_window_dkdv_compiles_for_hopper(tmp_path):
    """The kernel compiles for sm_90 with the installed Triton, no GPU needed (Gluon's API moves
    between releases). It fits Hopper's 227 KiB of shared memory a block, and its partitions take the
    registers its launch gives them (computing warpgroups 240, the copy warp 24)."""
    assert_compiles_for_hopper("nsa.ops.window.gluon_dkdv", tmp_path, G=16, gated=True, forced=True)


def test_gluon_window_dkdv_takes_what_its_copies_and_tiles_allow():
    """Where the Gluon dK/dV applies, device aside (:func:`shapes_fit`): 16-bit contiguous inputs with
    128-wide heads, 8-64 heads a KV head in the Triton kernel's Hopper tiles (64 rows, 128 keys);
    anything else runs the Triton kernel. And never on CPU tensors."""
    from nsa.ops.window import gluon_dkdv

    def case(HQ=16, H=1, D=128, dtype=torch.bfloat16, tiles=None, transpose=False):
        q = torch.randn(1, 64, HQ, D, dtype=dtype)
        q = q.transpose(1, 2).contiguous().transpose(1, 2) if transpose else q
        k = torch.randn(1, 64, H, D, dtype=dtype)
        G = HQ // H
        return gluon_dkdv.shapes_fit(q, k, k, q, tiles or dict(GP=G, BT=64 // G, BN=128))

    assert case() and case(HQ=64, H=8) and case(HQ=64) and case(HQ=32, H=4) and case(dtype=torch.float16)
    assert not case(D=64)
    assert not case(HQ=12, H=1, tiles=dict(GP=16, BT=4, BN=128))  # 12 heads pad to 16 rows
    assert not case(HQ=4, tiles=dict(GP=4, BT=16, BN=128))
    assert not case(tiles=dict(GP=16, BT=4, BN=64))
    assert not case(tiles=dict(GP=16, BT=2, BN=128))
    assert not case(dtype=torch.float32)
    assert not case(transpose=True)
    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    assert not gluon_dkdv.fits(q, q[:, :, :1], q[:, :, :1], q, dict(GP=16, BT=4, BN=128))


@pytest.mark.gpu
@pytest.mark.parity
@WINDOW_IN_NSA
def test_gluon_window_dkdv_matches_triton_in_nsa(B, T, HQ, H, nsa_device, monkeypatch):
    """dq, dk, dv and the gates' gradient of the NSA prefill with the Gluon window dK/dV equal the
    Triton kernel's within bf16 rounding: the window's dK/dV there takes the selected branch's local
    blocks, gates, a phased walk and adds to the selected branch's gradients; lengths that end inside
    a query tile and a key tile, a batch, 8-64 heads a KV head; and the Gluon kernel did run."""
    from nsa.ops.window import gluon_dkdv

    window_grads_flag_off_and_on(monkeypatch, nsa_device, "NSA_GLUON_WINDOW_DKDV", gluon_dkdv, "window_bwd_dkdv_gluon",
                                 B, T, HQ, H)


@pytest.mark.gpu
@pytest.mark.parity
@WINDOW_ALONE
def test_gluon_window_dkdv_matches_triton_alone(B, T, HQ, H, q_offset, window, nsa_device, monkeypatch):
    """The sliding-window op alone (no forced blocks, no gates, nothing to add to): dq, dk and dv with
    the Gluon dK/dV equal the Triton kernel's within bf16 rounding, with ``q_offset`` (keys before the
    first query), windows shorter and longer than the 128-key tile's band, and a batch."""
    from nsa.ops.window import gluon_dkdv

    window_grads_flag_off_and_on(monkeypatch, nsa_device, "NSA_GLUON_WINDOW_DKDV", gluon_dkdv, "window_bwd_dkdv_gluon",
                                 B, T, HQ, H, q_offset, window)
