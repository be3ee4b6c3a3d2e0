"""Addresses past 2**31 elements: the kernels' 64-bit offsets, on a GPU.

A kernel that computes an element offset in 32-bit integers reads and writes the wrong place
once a tensor holds more than 2**31 elements, and nothing at the sizes of the parity tests
reaches that. Here each case makes one family of tensors pass it with short sequences in a
wide batch: the last sequence is a copy of the first, so every output and gradient of the last
(whose elements lie past 2**31) must equal the first's bit for bit (the kernels are
deterministic and give each sequence the same programs), and the first is checked against the
float32 reference. A wrapped offset shows as a difference, a fault, or NaN from the poisoned
buffers.
"""

from __future__ import annotations

import pytest
import torch

from _kernel_inputs import nsa_run, reference_selection
from nsa import NSAConfig, nsa_attention
from nsa.ops import mean_compress
from nsa.ops.decode import nsa_decode
from nsa.testing import SELECTION_EPS, assert_close, assert_valid_selection, decode_row_reference

pytestmark = [pytest.mark.gpu, pytest.mark.triton, pytest.mark.parity, pytest.mark.long_context]

PAST = 2**31
HQ, H, D = 64, 4, 128

#: ``(batch, T, what passes 2**31 elements)``; the marks hold each case's peak (H100, session 32: 33.7,
#: 8.3 and 16.5 GiB) with some room.
PREFILL_CASES = [
    # q, o, do, dq: 257 * 1024 * 64 * 128 = 2.16e9 elements
    pytest.param(257, 1024, "q", marks=pytest.mark.requires(memory_gib=40), id="B257-T1024-q"),
    # the selected dK/dV kernel's dS for the dQ, [B, T, H, 16 blocks, G, 64]: 33 * 1024 * 65536 = 2.2e9
    pytest.param(33, 1024, "selected dS", marks=pytest.mark.requires(memory_gib=12), id="B33-T1024-selected-dS"),
    # the compressed dK/dV kernel's dS staircase: 13 * 1.67e8 = 2.17e9 (B = 1 passes it from 32k on)
    pytest.param(13, 8192, "compressed dS", marks=pytest.mark.requires(memory_gib=20), id="B13-T8192-compressed-dS"),
]


def _record_buffers(monkeypatch) -> dict:
    """Elements of each dS buffer the backward allocates, by branch."""
    from nsa.ops.compressed import kernel as compressed
    from nsa.ops.selected import kernel as selected

    sizes = {"selected dS": [], "compressed dS": []}
    real_selected, real_compressed = selected.ds_buffer, compressed._ds_buffer

    def selected_buffer(*args, **kwargs):
        buffer = real_selected(*args, **kwargs)
        sizes["selected dS"].append(0 if buffer is None else buffer.numel())
        return buffer

    def compressed_buffer(*args, **kwargs):
        ds = real_compressed(*args, **kwargs)
        sizes["compressed dS"].append(0 if ds is None else ds["buffer"].numel())
        return ds

    monkeypatch.setattr(selected, "ds_buffer", selected_buffer)
    monkeypatch.setattr(compressed, "_ds_buffer", compressed_buffer)
    return sizes


@pytest.mark.parametrize("B, T, passing", PREFILL_CASES)
def test_prefill_past_2_31_elements(B, T, passing, nsa_device, nsa_tolerance, monkeypatch):
    config, bf16 = NSAConfig(), dict(device=nsa_device, dtype=torch.bfloat16)
    q = torch.randn(B, T, HQ, D, **bf16)
    k, v = (torch.randn(B, T, H, D, **bf16) for _ in range(2))
    gates = torch.rand(B, T, HQ, 3, **bf16)
    do = torch.randn(B, T, HQ, D, **bf16)
    for x in (q, k, v, gates, do):
        x[-1] = x[0]
    for flag in ("NSA_SELECTED_DQ_FROM_DS_MIB", "NSA_COMPRESSED_DQ_FROM_DS_MIB"):
        monkeypatch.setenv(flag, "8192")  # the dS buffers of these cases (4.1-4.4 GiB) on any GPU they fit
    sizes = _record_buffers(monkeypatch)
    leaves = [x.requires_grad_() for x in (q, k, v, gates)]
    o, blocks = nsa_attention(*leaves, config, backend="triton", return_block_idx=True)
    o.backward(do)
    largest = q.numel() if passing == "q" else max(sizes[passing])
    assert largest > PAST, f"{passing} holds {largest} elements, not past 2**31: the case tests nothing"

    got = {"o": o, "block_idx": blocks, **{f"d{n}": x.grad for n, x in zip(("q", "k", "v", "gates"), leaves)}}
    for name, value in got.items():
        assert torch.equal(value[-1], value[0]), (
            f"{name} of sequence {B - 1} (past 2**31 elements) differs from sequence 0, its copy, "
            f"by up to {(value[-1].double() - value[0].double()).abs().max():.3g}")

    first = [x.detach()[:1].float() for x in (q, k, v, gates)]
    assert_valid_selection(blocks[:1], *reference_selection(first[0], first[1], config), config,
                           eps=SELECTION_EPS[torch.bfloat16])
    ref_o, _, ref_grads = nsa_run(*first, config, "reference", do[:1].double(), block_idx=blocks[:1])
    assert_close("o", o[:1], ref_o, nsa_tolerance(torch.bfloat16, "fwd"))
    for name, want in zip(("dq", "dk", "dv", "dgates"), ref_grads):
        assert_close(name, got[name][:1], want, nsa_tolerance(torch.bfloat16, "grad"))


@pytest.mark.requires(memory_gib=12)  # 9.1 GiB at 64 sequences (H100, session 32)
def test_decode_past_2_31_elements(nsa_device, nsa_tolerance):
    """The KV cache ``[65, 65600, 4, 128]``: the last sequence starts at element 64 * 65600 * 512,
    past 2**31, and reads its whole cache (the others stop short, to keep the step quick). It is
    a copy of the first, with the launch's own choices and with every descriptor (bulk copy)
    path off, so that the plain loads of Hopper's other paths and of older GPUs are checked too."""
    from nsa.ops.decode.kernel import decode_fwd

    config, bf16 = NSAConfig(), dict(device=nsa_device, dtype=torch.bfloat16)
    B, cap = 65, 65600
    k, v = (torch.randn(B, cap, H, D, **bf16) for _ in range(2))
    assert (B - 1) * k.stride(0) >= PAST
    q, gates = torch.randn(B, 1, HQ, D, **bf16), torch.rand(B, 1, HQ, 3, **bf16)
    lens = [cap] + [1000 + 37 * b for b in range(1, B - 1)] + [cap]
    for x in (q, k, v, gates):
        x[-1] = x[0]
    k_cmp, v_cmp = mean_compress(k, config), mean_compress(v, config)
    seq_lens = torch.tensor(lens, device=nsa_device, dtype=torch.int32)
    args = (q, k, v, gates, seq_lens, k_cmp, v_cmp, k, v, config, config.softmax_scale(D))
    with torch.no_grad():
        for launch in ({}, dict(cmp_desc=False, win_desc=False, sel_desc=False)):
            o, idx = decode_fwd(*args, **launch)
            assert torch.equal(o[-1], o[0]) and torch.equal(idx[-1], idx[0]), (
                f"launch {launch}: the last sequence (past 2**31 elements) differs from the first, its copy: o by "
                f"up to {(o[-1].float() - o[0].float()).abs().max():.3g}, blocks equal: {torch.equal(idx[-1], idx[0])}")
    first = lambda t: t[:1].float()  # noqa: E731
    _, ref_idx = nsa_decode(first(q), first(k), first(v), first(gates), seq_lens[:1], config, backend="reference",
                            kv_cmp=(first(k_cmp), first(v_cmp)), return_block_idx=True)
    ref_o = decode_row_reference(0, cap, q, k, v, gates, k_cmp, v_cmp, k, v, idx, ref_idx, config)
    assert_close("o", o[:1], ref_o, nsa_tolerance(torch.bfloat16, "fwd"))
