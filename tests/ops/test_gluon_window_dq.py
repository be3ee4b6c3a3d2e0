"""The window dQ's Gluon kernel (Hopper, ``NSA_GLUON_WINDOW_DQ``) against the Triton one.

Gluon has no CPU interpreter, so the comparisons run on Hopper GPUs only; on CPU the kernel is
compiled for sm_90 with the installed Triton. The Triton kernel the GPU tests compare with is checked
against the float64 reference in ``test_window_kernel.py`` and, inside the NSA prefill (the selected
branch's initial and local blocks, gates, the gradient added to the other branches'), in
``test_nsa_attention_kernel.py``.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from _gluon_kernels import WINDOW_ALONE, WINDOW_IN_NSA, assert_compiles_for_hopper, window_grads_flag_off_and_on


def test_gluon_window_dq_compiles_for_hopper(tmp_path):
    """The kernel compiles for sm_90 with the installed Triton, no GPU needed (Gluon's API moves
    between releases). It fits Hopper's 227 KiB of shared memory a block, and its partitions take the
    registers its launch gives them (computing warpgroups 240, the copy warp 24)."""
    assert_compiles_for_hopper("nsa.ops.window.gluon_dq", tmp_path, G=16, gated=True, forced=True)


def test_gluon_window_dq_takes_what_its_copies_allow():
    """Where the Gluon dQ applies, device aside (:func:`shapes_fit`): 16-bit contiguous inputs with
    128-wide heads and 8-64 heads a KV head; with the selected branch's forced blocks, blocks of 64
    keys and a ``q_offset`` that keeps a program's positions (two query tiles) in one block. Anything
    else runs the Triton kernel; and never on CPU tensors."""
    from nsa.ops.window import gluon_dq

    def case(HQ=16, H=1, D=128, dtype=torch.bfloat16, q_offset=0, forced_block=0, transpose=False):
        q = torch.randn(1, 64, HQ, D, dtype=dtype)
        q = q.transpose(1, 2).contiguous().transpose(1, 2) if transpose else q
        k = torch.randn(1, 64, H, D, dtype=dtype)
        return gluon_dq.shapes_fit(q, k, k, q, q_offset, forced_block)

    assert case() and case(HQ=64, H=8) and case(HQ=64) and case(HQ=32, H=4) and case(dtype=torch.float16)
    assert case(forced_block=64) and case(forced_block=64, q_offset=8) and case(q_offset=3)
    assert not case(forced_block=64, q_offset=4)  # 8 positions a program at 16 heads a KV head
    assert case(HQ=32, H=4, forced_block=64, q_offset=16) and not case(HQ=32, H=4, forced_block=64, q_offset=8)
    assert not case(forced_block=32)
    assert not case(D=64)
    assert not case(HQ=12, H=1)
    assert not case(HQ=4, H=1)
    assert not case(dtype=torch.float32)
    assert not case(transpose=True)
    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    assert not gluon_dq.fits(q, q[:, :, :1], q[:, :, :1], q, 0)


@pytest.mark.gpu
@pytest.mark.parity
@WINDOW_IN_NSA
def test_gluon_window_dq_matches_triton_in_nsa(B, T, HQ, H, nsa_device, monkeypatch):
    """dq, dk, dv and the gates' gradient of the NSA prefill with the Gluon window dQ equal the Triton
    kernel's within bf16 rounding: the window's dQ there takes the selected branch's initial and
    local blocks and gates, and adds to the other branches' dQ; lengths that end inside a query tile
    and a key tile, a batch, 8-64 heads a KV head; and the Gluon kernel did run."""
    from nsa.ops.window import gluon_dq

    window_grads_flag_off_and_on(monkeypatch, nsa_device, "NSA_GLUON_WINDOW_DQ", gluon_dq, "window_bwd_dq_gluon",
                                 B, T, HQ, H)


@pytest.mark.gpu
@pytest.mark.parity
@WINDOW_ALONE
def test_gluon_window_dq_matches_triton_alone(B, T, HQ, H, q_offset, window, nsa_device, monkeypatch):
    """The sliding-window op alone (no forced blocks, no gates, nothing to add to): dq, dk and dv with
    the Gluon dQ equal the Triton kernel's within bf16 rounding, with ``q_offset`` (keys before the
    first query, not a multiple of a program's positions), windows shorter and longer than a query
    tile's band of 64-key tiles, and a batch."""
    from nsa.ops.window import gluon_dq

    window_grads_flag_off_and_on(monkeypatch, nsa_device, "NSA_GLUON_WINDOW_DQ", gluon_dq, "window_bwd_dq_gluon",
                                 B, T, HQ, H, q_offset, window)
