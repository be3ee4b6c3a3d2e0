"""The TMA descriptors the Gluon kernels' launchers build (``nsa.ops._gluon``), checked on CPU: the
kernels compute their copies' coordinates from these row views, so a descriptor over the wrong view
would copy the wrong rows on the GPU."""

from __future__ import annotations

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)


def test_descriptors_view_queries_by_head_rows_and_keys_by_head_columns():
    """Queries ``[B, T, HQ, D]`` are ``[B T HQ, D]`` rows, one copy a position's ``G`` heads; keys ``[B,
    TK, H, D]`` are ``[B TK, H D]``, one copy ``keys`` rows of one head's ``D`` columns: the row and
    column a kernel asks for hold the element it means."""
    pytest.importorskip("triton.experimental.gluon")
    from nsa.ops._gluon import copy_layouts, head_rows_descriptor, key_rows_descriptor

    B, T, HQ, H, TK, D = 2, 5, 8, 2, 7, 128
    G = HQ // H
    q = torch.randn(B, T, HQ, D, dtype=torch.bfloat16)
    k = torch.randn(B, TK, H, D, dtype=torch.bfloat16)
    row_layout, key_layout = copy_layouts(q.dtype, G, 64, D)
    q_desc, k_desc = head_rows_descriptor(q, G, row_layout), key_rows_descriptor(k, 64, key_layout)
    assert (q_desc.shape, q_desc.strides, q_desc.block_shape) == ([B * T * HQ, D], [D, 1], [G, D])
    assert (k_desc.shape, k_desc.strides, k_desc.block_shape) == ([B * TK, H * D], [H * D, 1], [64, D])
    assert q_desc.base.data_ptr() == q.data_ptr() and k_desc.base.data_ptr() == k.data_ptr()
    b, t, h, s = 1, 3, 1, 4
    row = ((b * T + t) * H + h) * G  # the kernels' first row of position t's heads of KV head h
    assert torch.equal(q_desc.base[row:row + G], q[b, t, h * G:(h + 1) * G])
    assert torch.equal(k_desc.base[b * TK + s, h * D:(h + 1) * D], k[b, s, h])


def test_persistent_kernels_cover_every_item_of_every_head():
    """The persistent kernels' items: every (batch, KV head)'s tiles, and never more programs than
    items or than the GPU has SMs (on the CPU the interpreter's stand-in, 1)."""
    from nsa.ops._gluon import head_items_grid

    cpu = torch.device("cpu")
    assert head_items_grid(2, 4, 125, cpu) == (2 * 4 * 125, (1,))
    assert head_items_grid(1, 1, 126, cpu) == (126, (1,))


def test_a_launchs_descriptors_and_their_signature_agree():
    """:func:`launch_descriptors` gives the query-like tensors' head-row copies (``G`` from the heads
    over the keys' heads) and the key tensors' copies, in order, with the layouts that
    :func:`descriptor_signature` names for a kernel compiled without a GPU."""
    pytest.importorskip("triton.experimental.gluon")
    from nsa.ops._gluon import copy_layouts, descriptor_signature, descriptor_type, launch_descriptors

    B, T, HQ, H, TK, D = 2, 5, 32, 2, 7, 128
    q, do = (torch.randn(B, T, HQ, D, dtype=torch.float16) for _ in range(2))
    k = torch.randn(B, TK, H, D, dtype=torch.float16)
    descs = launch_descriptors((q, do), (k,), 64)
    assert [d.block_shape for d in descs] == [[16, D], [16, D], [64, D]]
    assert [d.shape for d in descs] == [[B * T * HQ, D], [B * T * HQ, D], [B * TK, H * D]]
    assert descs[0].base.data_ptr() == q.data_ptr() and descs[1].base.data_ptr() == do.data_ptr()
    row_layout, key_layout = copy_layouts(torch.float16, 16, 64, D)
    assert [d.layout for d in descs] == [row_layout, row_layout, key_layout]
    assert descriptor_signature(torch.float16, 16, 64, ("q_desc", "do_desc"), ("k_desc",), D) == {
        "q_desc": descriptor_type(torch.float16, [16, D], row_layout),
        "do_desc": descriptor_type(torch.float16, [16, D], row_layout),
        "k_desc": descriptor_type(torch.float16, [64, D], key_layout)}
