"""What the launchers know of the GPU they size a launch for, and a way to size for another one.

Every launch choice that depends on the GPU asks the functions below, never ``torch.cuda``
directly: tiles and pipeline stages that must fit its shared memory, whether it takes bulk
copies, how many programs fill it, how large a ``dS`` buffer may grow. So :func:`sized_as` can
make them answer for one of the GPUs of the shipped profiles (:data:`SHIPPED_GPUS`) instead of
the one at hand: the launches that an RTX 4090 or an A100 would make then run under the
interpreter in CI and on the H100 in the GPU tests, and ``scripts/launch_resources.py`` compiles
them for those GPUs without one.

The CPU (the interpreter) counts as a Hopper-sized GPU unless :func:`sized_as` says otherwise, so
that CI runs the launch configurations of the H100/H200.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Optional, Tuple, Union

import torch

_GIB = 2**30


@dataclass(frozen=True)
class GpuFacts:
    """The facts of a GPU that launch choices depend on."""

    #: compute capability ((9, 0) for Hopper)
    capability: Tuple[int, int]
    #: opt-in shared memory a program may use, bytes (the driver's ``max_shared_mem``)
    shared_memory: int
    #: streaming multiprocessors
    sms: int
    #: device memory, bytes
    memory: int


#: The GPUs of the shipped profiles (``gpu_profiles/``), as their drivers report them.
SHIPPED_GPUS = {
    "h100": GpuFacts((9, 0), 232448, 132, 80 * _GIB),
    "h200": GpuFacts((9, 0), 232448, 132, 141 * _GIB),
    "a100": GpuFacts((8, 0), 166912, 108, 80 * _GIB),
    "rtx4090": GpuFacts((8, 9), 101376, 128, 24 * _GIB),
    "rtx3090": GpuFacts((8, 6), 101376, 82, 24 * _GIB),
}

#: Opt-in shared memory per program from which the deeper pipelines and wider tiles tuned on
#: Hopper (227 KiB) are used; the A100 (163 KiB) and consumer GPUs (99 KiB) keep the smaller ones.
LARGE_SHARED_MEMORY = 200 * 1024

#: Below this much shared memory a program (consumer GPUs: 99 KiB), the backward launches of heads
#: wider than 128 take one stage or narrower tiles (their tuned ones ask 104-112 KiB, sm_89
#: compiles).
SMALL_SHARED_MEMORY = 128 * 1024

_sized_for: Optional[GpuFacts] = None


@contextlib.contextmanager
def sized_as(gpu: Union[str, GpuFacts]) -> Iterator[GpuFacts]:
    """Within the block, size every launch as for ``gpu`` (a key of :data:`SHIPPED_GPUS` or
    :class:`GpuFacts`), whatever device the tensors are on. Not thread-safe: for tests and scripts."""
    global _sized_for
    if isinstance(gpu, str):
        if gpu not in SHIPPED_GPUS:
            raise ValueError(f"gpu must be one of {', '.join(SHIPPED_GPUS)}, got {gpu!r}")
        gpu = SHIPPED_GPUS[gpu]
    before, _sized_for = _sized_for, gpu
    try:
        yield gpu
    finally:
        _sized_for = before


#: What the CPU (the interpreter) counts as: a Hopper-sized GPU of 32 GiB. Its SM count is each
#: caller's own stand-in (:func:`sm_count`).
INTERPRETER = GpuFacts((9, 0), SHIPPED_GPUS["h100"].shared_memory, 1, 32 * _GIB)


def gpu_facts(device: torch.device) -> GpuFacts:
    """The facts that launches on ``device`` are sized for: the GPU of :func:`sized_as` inside such
    a block, else :data:`INTERPRETER` on the CPU, else the CUDA device's own (asked once)."""
    if _sized_for is not None:
        return _sized_for
    if device.type != "cuda":
        return INTERPRETER
    return _cuda_facts(device.index if device.index is not None else torch.cuda.current_device())


@lru_cache(maxsize=None)
def _cuda_facts(index: int) -> GpuFacts:
    props = torch.cuda.get_device_properties(index)
    optin = getattr(props, "shared_memory_per_block_optin", None)
    if optin is None:  # older torch: ask Triton's driver
        from triton.runtime import driver

        optin = driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return GpuFacts((props.major, props.minor), int(optin), props.multi_processor_count, props.total_memory)


def sm_count(device: torch.device, interpreter: int = 1) -> int:
    """Streaming multiprocessors of ``device``; on the CPU, ``interpreter`` stands in (launch
    heuristics then see a tiny GPU, so small test problems still take their multi-program paths)."""
    facts = gpu_facts(device)
    return interpreter if facts is INTERPRETER else facts.sms


def shared_memory_per_program(device: torch.device) -> int:
    """Opt-in shared memory a program may use on ``device``, bytes; the CPU counts as Hopper."""
    return gpu_facts(device).shared_memory


def large_shared_memory(device: torch.device) -> bool:
    """Whether ``device`` offers a program at least :data:`LARGE_SHARED_MEMORY` of shared memory."""
    return shared_memory_per_program(device) >= LARGE_SHARED_MEMORY


def small_shared_memory(device: torch.device) -> bool:
    """Whether ``device`` offers a program less than :data:`SMALL_SHARED_MEMORY` (consumer GPUs)."""
    return shared_memory_per_program(device) < SMALL_SHARED_MEMORY


def float32_head_dim_limit(device: torch.device) -> Optional[int]:
    """The widest heads whose float32 launches (exact products, the only float32 precision off
    Hopper) fit ``device``'s shared memory, or None for any width (Hopper). Compiled at their own
    tiles (Triton 3.6, docs/perf/float32.md, session 30): heads of 128 ask at most 84 KiB, within a
    consumer GPU's 99; heads of 192 ask up to 145 KiB with 128-wide values and 164 KiB with
    192-wide ones, past an A100's 163."""
    return None if shared_memory_per_program(device) >= LARGE_SHARED_MEMORY else 128


#: Ops whose launches do not fit some GPUs' shared memory for some head widths (:func:`heads_fit`):
#: the window's forward and backward and the compressed branch's kernels. The selected kernels read
#: their blocks in key tiles instead (:func:`nsa.ops.selected.kernel.smaller_launch`), and the
#: others fit (sm_80, sm_89 and sm_90 compiles, session 80, docs/perf/other_gpus.md).
WIDE_HEAD_OPS = ("compressed", "window")
#: The widest heads whose launches of :data:`WIDE_HEAD_OPS` fit any GPU: heads of 512 ask 320-393 KiB
#: of an H200's 227 (bf16, sm_90 compiles, session 80).
WIDEST_HEADS = 256


def heads_fit(dk: int, dv: int, device: torch.device) -> bool:
    """Whether the launches of :data:`WIDE_HEAD_OPS` with key heads ``dk`` and value heads ``dv``
    wide fit ``device``'s shared memory (float32 below Hopper has a narrower limit,
    :func:`float32_head_dim_limit`): heads up to :data:`WIDEST_HEADS`, and below
    :data:`SMALL_SHARED_MEMORY` one of the two at most 128 wide. On an RTX 4090, 192/128 fits
    (session 27); 192/192 and 256/256 ask 100.5-112 KiB of its 99 in the window's kernels and the
    compressed backward, even in one stage where they take it (session 80)."""
    if max(dk, dv) > WIDEST_HEADS:
        return False
    return not small_shared_memory(device) or min(dk, dv) <= 128


def capability_major(device: torch.device) -> int:
    """Major compute capability of ``device`` (9 for Hopper); the CPU counts as Hopper."""
    return gpu_facts(device).capability[0]


def bulk_copies_supported(device: torch.device) -> bool:
    """Whether tensor-descriptor (TMA) bulk copies run on ``device``: Hopper (compute capability
    9.0) or later. The CPU counts as able, since the interpreter runs them, so that CI tests the
    path that the H100/H200 take."""
    return capability_major(device) >= 9


def pdl_supported(device: torch.device) -> bool:
    """Whether launches on ``device`` can start while the one before them runs (programmatic
    dependent launch, ``launch_pdl`` and ``gdc_wait``): Hopper (compute capability 9.0) or later.
    Callers pass ``launch_pdl`` only on a GPU; the interpreter knows neither."""
    return capability_major(device) >= 9


def min_dot_side(device: torch.device) -> int:
    """The smallest side of a ``tl.dot`` operand that launches on ``device`` may use: 16 on a GPU,
    1 under the interpreter (whose small CPU tests take smaller tiles)."""
    return 16 if device.type == "cuda" else 1


def device_memory(device: torch.device) -> int:
    """Bytes of memory of ``device``; the CPU counts as 32 GiB."""
    return gpu_facts(device).memory
