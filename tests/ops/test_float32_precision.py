"""float32 inputs: which ``tl.dot`` precision the Triton kernels take, and that every launch takes it.

The precision follows ``torch.get_float32_matmul_precision()`` unless ``NSA_FLOAT32_DOT`` says
otherwise (:func:`nsa.ops._triton.attention.dot_precision`). On CPU the interpreter computes every
``tl.dot`` in float32 whatever the precision, so these tests check what each launch is given; the
``gpu`` test checks what the tensor-core precision computes.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Set, Tuple

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from nsa import NSAConfig, flags
from nsa.ops import mean_compress
from nsa.ops._triton.attention import dot_precision
from nsa.ops.decode import nsa_decode
from nsa.testing import assert_close

from _kernel_inputs import every_launch, nsa_forward_backward, qkv

pytestmark = pytest.mark.triton
CPU = torch.device("cpu")


@pytest.fixture
def float32_matmul_precision():
    """``torch.set_float32_matmul_precision``, restored after the test."""
    saved = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(saved)


@pytest.mark.parametrize(
    "torch_level, flag, expected",
    [
        ("highest", None, "ieee"),
        ("high", None, "tf32x3"),
        ("medium", None, "tf32"),
        ("medium", "auto", "tf32"),
        ("high", "ieee", "ieee"),
        ("highest", "tf32x3", "tf32x3"),
        ("highest", "tf32", "tf32"),
    ],
)
def test_float32_precision_follows_torch_unless_the_flag_says(torch_level, flag, expected, monkeypatch,
                                                              float32_matmul_precision):
    float32_matmul_precision(torch_level)
    if flag is None:
        monkeypatch.delenv("NSA_FLOAT32_DOT", raising=False)
    else:
        monkeypatch.setenv("NSA_FLOAT32_DOT", flag)
    assert dot_precision(torch.float32, CPU, 128) == expected
    # heads wider than 128: the tensor-core launches are not sized for them, whatever was asked
    assert dot_precision(torch.float32, CPU, 192) == "ieee"
    for dtype in (torch.bfloat16, torch.float16):  # 16-bit products are exact in any case
        assert dot_precision(dtype, CPU, 128) == "tf32"


@pytest.mark.parametrize("shared_kib, flag, expected", [(227, None, "tf32x3"), (163, None, "ieee"), (99, None, "ieee"),
                                                       (227, "tf32", "tf32"), (163, "tf32x3", "ieee")])
def test_exact_float32_where_the_tensor_core_tiles_do_not_fit(shared_kib, flag, expected, monkeypatch,
                                                              float32_matmul_precision):
    """The tensor-core launches are sized for Hopper's shared memory: on a GPU with less (an A100's
    163 KiB, a consumer card's 99) float32 stays exact, whether torch's setting or the flag asked."""
    from nsa.ops._triton.device import SHIPPED_GPUS, sized_as

    float32_matmul_precision("high")
    if flag is None:
        monkeypatch.delenv("NSA_FLOAT32_DOT", raising=False)
    else:
        monkeypatch.setenv("NSA_FLOAT32_DOT", flag)
    with sized_as(dataclasses.replace(SHIPPED_GPUS["h100"], shared_memory=shared_kib * 1024)):
        assert dot_precision(torch.float32, CPU, 128) == expected


def test_bad_float32_precision_names_the_flag(monkeypatch):
    monkeypatch.setenv("NSA_FLOAT32_DOT", "fp32")
    with pytest.raises(flags.FlagError, match="NSA_FLOAT32_DOT='fp32'.*ieee, tf32x3, tf32"):
        dot_precision(torch.float32, CPU, 128)


def _precisions(launches) -> Dict[str, Set[Tuple[str, int]]]:
    """The ``PREC`` argument and the pipeline stages (0: Triton's default) of every launch of
    :func:`every_launch` that takes a ``PREC``: ``{kernel: {(PREC, num_stages)}}``."""
    seen: Dict[str, Set[Tuple[str, int]]] = {}
    for name, kwargs in launches:
        if "PREC" in kwargs:
            seen.setdefault(name, set()).add((kwargs["PREC"], kwargs.get("num_stages", 0)))
    return seen


SMALL = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=8, sel_count=4, window=16)

#: Kernels whose float32 tiles ask more than an H100's 227 KiB of shared memory on tensor cores
#: unless they take one pipeline stage (sm_90 compiles, ``scripts/launch_resources.py``: 256 KiB with
#: two stages or, for the decode's compressed pass, three).
ONE_STAGE_ON_TENSOR_CORES = {"compressed_fwd_kernel", "compressed_bwd_dkdv_kernel", "selected_bwd_dkdv_kernel",
                             "window_bwd_dq_kernel", "window_bwd_dkdv_kernel", "decode_cmp_win_fwd_kernel"}


def _inputs(T, HQ, H, D, device):
    """float32 ``q, k, v`` (:func:`qkv`, B = 1) and gates."""
    return (*qkv(1, T, HQ, H, D, D, torch.float32, device), torch.rand(1, T, HQ, 3, device=device))


@pytest.mark.parametrize("torch_level, flag, expected",
                         [("high", None, "tf32x3"), ("highest", "tf32", "tf32"), ("highest", None, "ieee")])
def test_every_float32_launch_takes_the_chosen_precision(torch_level, flag, expected, monkeypatch, nsa_device,
                                                         float32_matmul_precision):
    """Prefill forward and backward, and decode: each kernel that multiplies tiles is launched
    with the precision :func:`dot_precision` chose, none with another (a launcher that picked
    its own, as the decode's once did, fails this); on tensor cores, the kernels whose tiles
    would not fit otherwise take one pipeline stage, and exact float32 keeps its stages."""
    float32_matmul_precision(torch_level)
    if flag is None:
        monkeypatch.delenv("NSA_FLOAT32_DOT", raising=False)
    else:
        monkeypatch.setenv("NSA_FLOAT32_DOT", flag)
    q, k, v, gates = _inputs(40, 4, 1, 16, nsa_device)
    with every_launch() as launches:
        nsa_forward_backward(q, k, v, gates, SMALL, "triton", torch.randn(q.shape, dtype=torch.float64, device=nsa_device))
        k_cmp, v_cmp = mean_compress(k, SMALL), mean_compress(v, SMALL)
        nsa_decode(q[:, -1:], k, v, gates[:, -1:], torch.tensor([40], dtype=torch.int32, device=nsa_device), SMALL,
                   kv_cmp=(k_cmp, v_cmp), backend="triton")
    seen = _precisions(launches)
    assert {"compressed_fwd_kernel", "compressed_bwd_dkdv_kernel", "selected_fwd_kernel", "selected_bwd_dkdv_kernel",
            "window_fwd_kernel", "window_bwd_dq_kernel", "window_bwd_dkdv_kernel"} <= set(seen)
    assert {"decode_cmp_win_fwd_kernel", "decode_selected_fwd_kernel"} <= set(seen), sorted(seen)
    assert {name: launches for name, launches in seen.items() if {p for p, _ in launches} != {expected}} == {}
    stages = {name: {n for _, n in seen[name]} for name in ONE_STAGE_ON_TENSOR_CORES}
    if expected == "ieee":
        # exact products keep their tuned stages, but for the decode's compressed pass, whose
        # Triton default of 3 asks 264 KiB at head dim 128 (docs/perf/other_gpus.md)
        assert stages.pop("decode_cmp_win_fwd_kernel") == {1}
        assert all(1 not in n for n in stages.values()), stages
    else:
        assert all(n == {1} for n in stages.values()), stages


@pytest.mark.gpu
@pytest.mark.parity
@pytest.mark.requires(feature="triton_float32")
def test_float32_on_tensor_cores_matches_the_reference_on_gpu(nsa_device, nsa_tolerance, monkeypatch,
                                                               float32_matmul_precision):
    """``tf32x3`` (torch's "high") keeps float32 accuracy: the whole prefill, forward and gradients,
    within the float32 tolerances of a float64 reference, at the paper's head dim and group size."""
    float32_matmul_precision("high")
    monkeypatch.delenv("NSA_FLOAT32_DOT", raising=False)
    config = NSAConfig(window=128)
    q, k, v, gates = _inputs(600, 16, 1, 128, nsa_device)
    do = torch.randn(q.shape, dtype=torch.float64, device=nsa_device)
    got = nsa_forward_backward(q, k, v, gates, config, "triton", do)
    want = nsa_forward_backward(q.double(), k.double(), v.double(), gates.double(), config, "reference", do)
    for name, a, b in zip(("o", "dq", "dk", "dv", "dgates"), got, want):
        assert_close(name, a, b, nsa_tolerance(torch.float32, "fwd" if name == "o" else "grad"))
