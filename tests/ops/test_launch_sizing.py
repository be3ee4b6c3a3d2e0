"""Launches sized for each shipped GPU (:mod:`nsa.ops._triton.device`).

The launchers pick tiles, pipeline stages and bulk copies from the facts of the GPU, and
:func:`sized_as` makes them pick for another GPU than the one at hand. These tests pin what the
A100 and the consumer GPUs get, which the sm_80/sm_86/sm_89 compiles of
``scripts/launch_resources.py`` found to fit their shared memory (docs/perf/other_gpus.md);
``test_nsa_attention_kernel.py`` checks that those launches compute the same NSA.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional, Set, Tuple

import pytest
import torch

from nsa.routing import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from triton.tools.tensor_descriptor import TensorDescriptor

from nsa.ops._triton.device import (
    SHIPPED_GPUS,
    bulk_copies_supported,
    capability_major,
    device_memory,
    large_shared_memory,
    shared_memory_per_program,
    sized_as,
    small_shared_memory,
    sm_count,
)

from _kernel_inputs import prefill_and_decode_launches, qkv, spy_launches

pytestmark = pytest.mark.triton
CPU = torch.device("cpu")

#: How each launch that multiplies tiles changes for heads wider than 128 on a GPU with 99 KiB of
#: shared memory a program, against the same launch on an A100: ``{kernel: {field: value}}`` of
#: (num_stages, rows, BN). The tuned launches ask 104-112 KiB there (sm_89 compiles); one stage
#: fits the dQ kernels and the compressed forward, the dK/dV kernels need narrower tiles.
WIDE_ON_SMALL_GPU = {
    "compressed_fwd_kernel": {"num_stages": 1},
    "compressed_bwd_dq_kernel": {"num_stages": 1},
    "compressed_bwd_dkdv_kernel": {"BN": 32},
    "selected_bwd_dq_kernel": {"num_stages": 1},
    "selected_bwd_dkdv_kernel": {"num_stages": 1, "rows": 32},
    "selected_forced_dq_kernel": {"num_stages": 1, "rows": 32},
    "window_bwd_dq_kernel": {"num_stages": 1},
    "window_bwd_dkdv_kernel": {"BN": 32},
}


def _facts(device: torch.device) -> tuple:
    return (capability_major(device), shared_memory_per_program(device), sm_count(device), device_memory(device),
            bulk_copies_supported(device), large_shared_memory(device), small_shared_memory(device))


def test_sized_as_answers_for_the_named_gpu_and_restores():
    """Inside ``sized_as`` every fact is the named GPU's, whatever the tensors' device; nested
    blocks restore the outer GPU, and the CPU's own facts (a Hopper-sized interpreter) come back."""
    cpu = _facts(CPU)
    assert cpu == (9, SHIPPED_GPUS["h100"].shared_memory, 1, 32 * 2**30, True, True, False)
    with sized_as("rtx4090") as gpu:
        consumer = (8, 101376, 128, 24 * 2**30, False, False, True)
        assert gpu is SHIPPED_GPUS["rtx4090"] and _facts(CPU) == consumer
        with sized_as("a100"):
            assert _facts(CPU) == (8, 166912, 108, 80 * 2**30, False, False, False)
        assert _facts(CPU) == consumer
    assert _facts(CPU) == cpu


def test_sized_as_names_a_bad_gpu():
    with pytest.raises(ValueError, match=r"gpu must be one of h100, h200, a100, rtx4090, rtx3090, got 'v100'"):
        with sized_as("v100"):
            pass


def _launches(gpu: Optional[str], DK: int, DV: int, device: torch.device,
              dtype: torch.dtype = torch.float32) -> list:
    """Every launch of a prefill in ``dtype``, forward and backward, and of one decode step, sized
    for ``gpu`` (None: the device's own), recorded without running them (``prefill_and_decode_launches(execute=
    False)``): what is checked is the launchers' choice, which depends on shapes alone and which
    ``sized_as`` makes the same on any device. Under the interpreter only: the unwritten outputs
    feed later launches and host-side indexing, harmless on the CPU, while on a GPU a garbage
    block index could fault the device for the worker's later tests."""
    if device.type == "cuda":
        pytest.skip("launch choices are checked under the interpreter; on the GPU, "
                    "test_nsa_attention_sized_for_other_gpus_real_size runs the sized launches")
    with sized_as(gpu) if gpu else contextlib.nullcontext():
        return prefill_and_decode_launches(device, DK, DV, dtype, execute=False)


@pytest.mark.parametrize("gpu", [None, "a100", "rtx4090"])
def test_bulk_copies_only_where_the_gpu_takes_them(gpu, nsa_device):
    """The selected forward fetches its blocks by bulk copies (tensor descriptors) on Hopper and
    under the interpreter; sized for an A100 or a consumer GPU, no launch takes a descriptor."""
    launches = _launches(gpu, 16, 16, nsa_device)
    with_copies = {name for name, kwargs in launches
                   if any(isinstance(a, TensorDescriptor) for a in (*kwargs["args"], *kwargs.values()))}
    takes_copies = SHIPPED_GPUS[gpu].capability[0] >= 9 if gpu else bulk_copies_supported(nsa_device)
    assert ("selected_fwd_kernel" in with_copies) == takes_copies, sorted(with_copies)
    if not takes_copies:
        assert with_copies == set()


def _tile_launches(gpu: str, DK: int, monkeypatch, device: torch.device, dtype: torch.dtype,
                   fields: Tuple[str, ...] = ("num_stages", "rows", "BN")) -> Dict[str, Set[tuple]]:
    """``{kernel: {fields}}`` of every launch that multiplies tiles (it takes a ``PREC``), sized for
    ``gpu``, in ``dtype`` (float32 with exact ``ieee`` products), with both ``dQ`` paths of each
    branch (recomputing: the dS buffers off). ``rows`` counts query rows: positions times the
    group's padded heads."""
    monkeypatch.setenv("NSA_FLOAT32_DOT", "ieee")
    monkeypatch.setenv("NSA_SELECTED_DQ_FROM_DS_MIB", "0")
    monkeypatch.setenv("NSA_COMPRESSED_DQ_FROM_DS_MIB", "0")
    shapes: Dict[str, Set[tuple]] = {}
    for name, kw in _launches(gpu, DK, 128, device, dtype):
        if "PREC" in kw:
            kw = dict(kw, rows=(kw.get("BT") or kw.get("BQ") or 1) * kw.get("GP", 1))
            shapes.setdefault(name, set()).add(tuple(kw.get(f, 0 if f == "num_stages" else None) for f in fields))
    return shapes


def test_wide_heads_take_smaller_launches_where_the_tuned_ones_do_not_fit(monkeypatch, nsa_device):
    """On a GPU with 99 KiB a program (an RTX 4090; the 3090 has the same), 16-bit heads wider than
    128 change exactly the launches of :data:`WIDE_ON_SMALL_GPU`, as it says, against an A100's;
    128-wide heads change none."""
    gpu = "rtx4090"
    assert SHIPPED_GPUS["rtx3090"].shared_memory == SHIPPED_GPUS[gpu].shared_memory
    fields = ("num_stages", "rows", "BN")
    small, a100 = (_tile_launches(g, 192, monkeypatch, nsa_device, torch.float16) for g in (gpu, "a100"))
    assert set(WIDE_ON_SMALL_GPU) <= set(a100) and set(small) == set(a100), sorted(a100)
    expected = {name: {tuple(WIDE_ON_SMALL_GPU.get(name, {}).get(f, v) for f, v in zip(fields, shape))
                       for shape in shapes} for name, shapes in a100.items()}
    assert small == expected
    assert (_tile_launches(gpu, 128, monkeypatch, nsa_device, torch.float16)
            == _tile_launches("a100", 128, monkeypatch, nsa_device, torch.float16))


#: ``(num_stages, rows, BN, num_warps)`` of every launch with tile products where float32 is
#: multiplied exactly, heads 128 wide, on every shipped GPU (:data:`EXACT_FLOAT32_TILES`: 16 rows,
#: 32-token key tiles, 4 warps; the window forward keeps its 64-key tiles, the selected kernels
#: walk selection blocks; one stage for the selected forward and the decode's passes). At the
#: 16-bit inputs' tiles these launches spilled 8-14 KB a thread and asked up to 145 KiB of shared
#: memory; at these, at most 84 KiB (sm_80/sm_89/sm_90 compiles, docs/perf/float32.md).
EXACT_FLOAT32_LAUNCHES = {
    "compressed_fwd_kernel": (2, 16, 32, 4),
    "compressed_bwd_dq_kernel": (2, 16, 32, 4),
    "compressed_bwd_dkdv_kernel": (2, 16, 32, 4),
    "selected_forced_fwd_kernel": (2, 16, None, 4),
    "selected_fwd_kernel": (1, 16, None, 4),
    "selected_forced_dq_kernel": (2, 16, None, 4),
    "selected_bwd_dq_kernel": (2, 16, None, 4),
    "selected_bwd_dkdv_kernel": (2, 16, None, 4),
    "window_fwd_kernel": (2, 16, 64, 4),
    "window_bwd_dq_kernel": (2, 16, 32, 4),
    "window_bwd_dkdv_kernel": (2, 16, 32, 4),
    "decode_cmp_win_fwd_kernel": (1, 1, None, 4),
    "decode_selected_fwd_kernel": (1, 1, None, 4),
}


@pytest.mark.parametrize("gpu", ["h100", "a100", "rtx4090"])
def test_exact_float32_takes_its_own_tiles_on_every_gpu(gpu, monkeypatch, nsa_device):
    """float32 with exact products launches every kernel at :data:`EXACT_FLOAT32_LAUNCHES`, the
    same on each shipped GPU; float16 inputs keep the launches tuned for them, other in every
    prefill kernel. Heads 192 wide take twice the warps to the same 16 rows."""
    fields = ("num_stages", "rows", "BN", "num_warps")
    launches = _tile_launches(gpu, 128, monkeypatch, nsa_device, torch.float32, fields)
    assert launches == {name: {shape} for name, shape in EXACT_FLOAT32_LAUNCHES.items()}
    half = _tile_launches(gpu, 128, monkeypatch, nsa_device, torch.float16, fields)
    assert set(half) == set(launches)
    assert all(half[name] != launches[name] for name in launches if not name.startswith("decode")), half
    if gpu == "h100":  # heads wider than 128 (float32 takes Triton there on Hopper alone): twice the warps
        wide = _tile_launches(gpu, 192, monkeypatch, nsa_device, torch.float32, fields)
        prefill = [name for name in launches if not name.startswith("decode")]
        assert set(wide) == set(launches)
        assert {name: {(rows, warps) for _, rows, _, warps in wide[name]} for name in prefill} == {
            name: {(16, 8)} for name in prefill}


def test_a_callers_tiles_win_over_exact_float32s(monkeypatch, nsa_device):
    """Launch options the caller passes beat the exact float32 defaults they override (the rows of
    the window forward, the selected forward's stages), and the results stay the default's."""
    from nsa.ops.selected import kernel as selected
    from nsa.ops.window import kernel as window

    monkeypatch.setenv("NSA_FLOAT32_DOT", "ieee")
    q, k, v = qkv(1, 24, 4, 1, 16, 16, torch.float32, nsa_device)
    rows = spy_launches(monkeypatch, window, "window_fwd_kernel", "BT", "num_warps")
    want = window.window_fwd(q, k, v, 8, 0.25, 0)[0]
    got = window.window_fwd(q, k, v, 8, 0.25, 0, tiles={"rows": 32})[0]
    assert rows == [(4, 4), (8, 4)]  # 16 rows of 4 heads, then the caller's 32
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)
    stages = spy_launches(monkeypatch, selected, "selected_fwd_kernel", "num_stages")
    blocks = torch.zeros(1, 24, 1, 2, dtype=torch.int32, device=nsa_device)
    blocks[:, 8:, :, 1] = 1
    want = selected.selected_fwd(q, k, v, blocks, 8, 0.25, 0)[0]
    got = selected.selected_fwd(q, k, v, blocks, 8, 0.25, 0, tiles={"num_stages": 2})[0]
    assert stages == [1, 2]
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6)



class _TightKernel:
    """A stand-in for a Triton kernel whose launches need more shared memory than a GPU has past
    ``fits`` pipeline stages, or with fewer than ``key_tiles`` key tiles (Triton raises as it
    loads the compiled kernel, before it runs)."""

    def __init__(self, fits: int, resource: str = "shared memory", key_tiles: int = 1):
        self.fits, self.resource, self.key_tiles, self.stages = fits, resource, key_tiles, []

    def __getitem__(self, grid):
        from triton.runtime.errors import OutOfResources

        def launch(*args, num_stages, KEY_TILES=1, **kwargs):
            self.stages.append(num_stages if KEY_TILES == 1 else (num_stages, KEY_TILES))
            if num_stages > self.fits or KEY_TILES < self.key_tiles:
                raise OutOfResources(100_000 * num_stages, 232448, self.resource)

        return launch


def test_a_launch_past_shared_memory_takes_fewer_stages(monkeypatch):
    """Where the tuned stages do not fit (blocks of 128 keys with 192-wide heads asked 261-288 KiB
    of an H200's 227 in two stages: the fuzzer, session 79), the launch is made again with one stage
    fewer, and later launches of the same kernel and arguments start from the stages that fit;
    other arguments start from their own. Where one stage does not fit either, the op says so."""
    from nsa.ops._triton import launch
    from nsa.ops._triton.launch import launch_within_shared_memory
    from nsa.routing import BackendUnavailableError

    monkeypatch.setattr(launch, "_FITTED_SHRINKS", {})  # this test's stand-ins stay out of the process's
    q = torch.zeros(2, dtype=torch.float16)
    kernel = _TightKernel(fits=1)
    launch_within_shared_memory(kernel, (1,), "the op", q, BS=128, num_stages=3)
    launch_within_shared_memory(kernel, (1,), "the op", q, BS=128, num_stages=3)
    launch_within_shared_memory(kernel, (1,), "the op", q, BS=64, num_stages=2)
    assert kernel.stages == [3, 2, 1, 1, 2, 1]
    with pytest.raises(BackendUnavailableError, match="the op: its Triton kernel does not fit this GPU's shared "
                                                      "memory a program even in its smallest launch"):
        launch_within_shared_memory(_TightKernel(fits=0), (1,), "the op", q, num_stages=2)
    from triton.runtime.errors import OutOfResources

    with pytest.raises(OutOfResources, match="registers"):  # not shared memory: not this helper's to fix
        launch_within_shared_memory(_TightKernel(fits=0, resource="registers"), (1,), "the op", q, num_stages=2)


def test_a_selected_launch_past_shared_memory_reads_blocks_in_key_tiles(monkeypatch):
    """Past one stage, a selected kernel's launch reads each block in more, smaller key tiles
    (:func:`~nsa.ops.selected.kernel.smaller_launch`; exact float32 with 128-key blocks and heads
    wider than 128 asked 272-296 KiB of an H200's 227 in one stage), and later launches start
    from the tiles that fit. Past 16 keys a tile, the op says it does not fit."""
    from nsa.ops._triton import launch
    from nsa.ops._triton.launch import launch_within_shared_memory
    from nsa.ops.selected.kernel import smaller_launch
    from nsa.routing import BackendUnavailableError

    monkeypatch.setattr(launch, "_FITTED_SHRINKS", {})
    q = torch.zeros(2, dtype=torch.float32)
    kernel = _TightKernel(fits=1, key_tiles=4)
    for _ in range(2):
        launch_within_shared_memory(kernel, (1,), "the op", q, BSP=128, num_stages=2, KEY_TILES=1,
                                    smaller=smaller_launch)
    assert kernel.stages == [2, 1, (1, 2), (1, 4), (1, 4)]
    with pytest.raises(BackendUnavailableError, match="the op: its Triton kernel does not fit"):
        launch_within_shared_memory(_TightKernel(fits=1, key_tiles=16), (1,), "the op", q, BSP=128, num_stages=1,
                                    KEY_TILES=1, smaller=smaller_launch)
