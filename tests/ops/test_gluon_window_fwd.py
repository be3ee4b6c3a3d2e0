"""The window forward's Gluon kernel (Hopper, ``NSA_GLUON_WINDOW_FWD``) against the Triton one.

Gluon has no CPU interpreter, so the comparisons run on Hopper GPUs only; on CPU the kernel is
compiled for sm_90 with the installed Triton. The Triton kernel the GPU tests compare with is checked
against the float64 reference in ``test_window_kernel.py`` and, inside the NSA prefill (the selected
branch's forced blocks), in ``test_nsa_attention_kernel.py``.
"""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from _gluon_kernels import WINDOW_ALONE, WINDOW_IN_NSA, assert_compiles_for_hopper, window_grads_flag_off_and_on


def test_gluon_window_fwd_compiles_for_hopper(tmp_path):
    """The kernel compiles for sm_90 with the installed Triton, no GPU needed (Gluon's API moves
    between releases). It fits Hopper's 227 KiB of shared memory a block, and its partitions take the
    registers its launch gives them (computing warpgroups 240, the copy warp 24)."""
    assert_compiles_for_hopper("nsa.ops.window.gluon_fwd", tmp_path, G=16, forced=True)


def test_gluon_window_fwd_takes_the_dq_kernels_tiles():
    """The Gluon forward applies where the Gluon dQ does (the same programs and key tiles): 16-bit
    contiguous 128-wide heads, 8-64 heads a KV head, forced blocks of 64 keys holding whole programs;
    and never on CPU tensors."""
    from nsa.ops.window import gluon_fwd

    q = torch.randn(1, 64, 16, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 64, 1, 128, dtype=torch.bfloat16)
    assert gluon_fwd.shapes_fit(q, k, k, 0) and gluon_fwd.shapes_fit(q, k, k, 8, 64)
    assert not gluon_fwd.shapes_fit(q, k, k, 4, 64) and not gluon_fwd.shapes_fit(q, k, k, 0, 32)
    assert not gluon_fwd.shapes_fit(q.float(), k.float(), k.float(), 0)
    assert not gluon_fwd.shapes_fit(q[..., :64], k[..., :64], k[..., :64], 0)
    assert not gluon_fwd.fits(q, k, k, 0)


@pytest.mark.gpu
@pytest.mark.parity
@WINDOW_IN_NSA
def test_gluon_window_fwd_matches_triton_in_nsa(B, T, HQ, H, nsa_device, monkeypatch):
    """The NSA prefill's output and gradients with the Gluon window forward equal the Triton kernel's
    within bf16 rounding: there it also leaves the selected branch's state over its forced blocks (the
    selected forward's start) and the window's lse the backward reads; lengths that end inside a query
    tile and a key tile, a batch, 8-64 heads a KV head; and the Gluon kernel did run."""
    from nsa.ops.window import gluon_fwd

    window_grads_flag_off_and_on(monkeypatch, nsa_device, "NSA_GLUON_WINDOW_FWD", gluon_fwd, "window_fwd_gluon",
                                 B, T, HQ, H)


@pytest.mark.gpu
@pytest.mark.parity
@pytest.mark.parametrize("window", [192, 1000], ids=["window192", "window1000"])
def test_gluon_window_fwd_matches_triton_in_nsa_other_windows(window, nsa_device, monkeypatch):
    """As in the NSA prefill above, with windows that move the edge between the band's masked tiles and
    those inside every row's band (unmasked): 192 keys (one window tile or none inside every row's band)
    and 1000 (many inside, the band's edge at every offset within a tile)."""
    from nsa.ops.window import gluon_fwd

    window_grads_flag_off_and_on(monkeypatch, nsa_device, "NSA_GLUON_WINDOW_FWD", gluon_fwd, "window_fwd_gluon",
                                 1, 1500, 16, 1, nsa_window=window)


@pytest.mark.gpu
@pytest.mark.parity
@WINDOW_ALONE
def test_gluon_window_fwd_matches_triton_alone(B, T, HQ, H, q_offset, window, nsa_device, monkeypatch):
    """The sliding-window op alone (no forced blocks): its output, and the gradients from the lse it
    leaves, with the Gluon forward equal the Triton kernel's within bf16 rounding, with ``q_offset``
    (keys before the first query), windows shorter and longer than a query tile's band, and a batch."""
    from nsa.ops.window import gluon_fwd

    window_grads_flag_off_and_on(monkeypatch, nsa_device, "NSA_GLUON_WINDOW_FWD", gluon_fwd, "window_fwd_gluon",
                                 B, T, HQ, H, q_offset, window)
