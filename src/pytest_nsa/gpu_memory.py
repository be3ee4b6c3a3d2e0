"""What each test took of the GPU's memory: its peak, what it left allocated, and the local
memory the driver reserved for its kernels' register spills.

xdist workers that share a GPU run their ordinary tests side by side; a test that needs
more than its share of the device's memory then fails with out-of-memory errors that it
would not have alone, and so do the tests beside it (session 29: eight failures in one
run on an H100 with 12 workers). Such a test belongs under ``requires(memory_gib=...)``
(it then runs alone, :mod:`pytest_nsa.sharing`), and a test that leaves tensors allocated
after its teardown holds them while the other workers' tests run. Neither shows in a
pass/fail count, so the plugin measures every test where torch's CUDA is in use: the
allocator's peak over setup, call and teardown, what stayed allocated after the
teardown (after a garbage collection where that is much), and the local memory the CUDA
driver reserved for its kernels' register spills (:func:`driver_stack`), which torch does not
see: on a shared GPU a float32 test at head dim 192 left 13.7 GiB of it behind in its worker,
and a 50-GiB test that ran alone then failed for want of it.

No pytest import here: :mod:`pytest_nsa.plugin` calls :func:`start` and :func:`measure`
from its hooks; the report and the terminal summary read :func:`summary`.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from pytest_nsa.state import TestOutcome

#: The ``user_properties`` key the measurement travels under (through xdist too).
PROPERTY = "nsa_gpu_memory"
#: Above this many bytes still allocated after a test (beyond what it started with), collect
#: garbage and measure again: tensors held only by reference cycles wait for the collector.
COLLECT_ABOVE = 256 * 2**20
#: A test whose allocation grew by more than this between its setup and the end of its
#: teardown is listed as keeping memory.
KEPT_GIB = 0.25
#: How many of the largest peaks the summary lists.
LARGEST = 10
GIB = 2**30

#: CUDA's per-thread stack limit when a context starts (``cudaLimitStackSize``), in bytes.
DEFAULT_STACK = 1024
_CU_LIMIT_STACK_SIZE = 0
#: Local memory (GiB) from which a test's kernels are named for it.
LOCAL_GIB = 1.0

#: ``(peak, allocated at the start, allocated after the teardown, ran alone, local memory)``: bytes
#: but ``alone``; ``local`` is what the driver reserved for the per-thread stacks of the test's
#: kernels where they needed more than any kernel before them in the process (0 otherwise).
Measured = Tuple[int, int, int, bool, int]


def cuda_in_use() -> Any:
    """torch.cuda where a test has initialised it, else ``None`` (torch is never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


@lru_cache(maxsize=None)
def _libcuda() -> Any:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:  # no driver library here (CPU machines, other systems)
        return None


def driver_stack() -> Optional[int]:
    """The current CUDA context's per-thread stack limit in bytes (``None`` where it cannot be read).

    Kernels that spill registers need per-thread stacks; the driver grows the limit to the
    largest any launch needed and keeps local memory for it on every thread the GPU can hold
    (stack x threads an SM x SMs: 52 KB stacks take 13.7 GiB on an H100), for the life of the
    context. torch's allocator neither sees nor frees that memory."""
    libcuda = _libcuda()
    if libcuda is None or cuda_in_use() is None:
        return None
    value = ctypes.c_size_t()
    return int(value.value) if libcuda.cuCtxGetLimit(ctypes.byref(value), _CU_LIMIT_STACK_SIZE) == 0 else None


def reset_driver_stack() -> bool:
    """Set the stack limit back to :data:`DEFAULT_STACK` where it grew, which frees the local memory
    (the driver grows it again for the next launch that needs it); returns whether it did."""
    stack = driver_stack()
    if stack is None or stack <= DEFAULT_STACK:
        return False
    return _libcuda().cuCtxSetLimit(_CU_LIMIT_STACK_SIZE, ctypes.c_size_t(DEFAULT_STACK)) == 0


def local_memory(stack: int) -> int:
    """Bytes of local memory the driver keeps for ``stack``-byte stacks on every resident thread."""
    cuda = cuda_in_use()
    props = cuda.get_device_properties(cuda.current_device())
    return stack * props.max_threads_per_multi_processor * props.multi_processor_count


#: What :func:`start` hands to :func:`measure`: bytes allocated and the stack limit at the start.
Start = Tuple[int, Optional[int]]


def start() -> Optional[Start]:
    """At a test's setup: reset the allocator's peak; returns the bytes allocated now and the
    driver's stack limit (``None`` while CUDA is not initialised: the test's first use then
    starts from zero)."""
    cuda = cuda_in_use()
    if cuda is None:
        return None
    cuda.reset_peak_memory_stats()
    return int(cuda.memory_allocated()), driver_stack()


def allocated_after_collecting(baseline: int = 0) -> int:
    """Bytes allocated now, after a garbage collection where more than :data:`COLLECT_ABOVE` is
    allocated beyond ``baseline`` (what the test started with: a session fixture's tensors cost
    no collection after every test)."""
    cuda = cuda_in_use()
    if cuda is None:
        return 0
    if cuda.memory_allocated() - baseline > COLLECT_ABOVE:
        gc.collect()
    return int(cuda.memory_allocated())


def measure(at_start: Optional[Start], alone: bool) -> Optional[Measured]:
    """After a test's teardown: its :data:`Measured`, or ``None`` where CUDA was never used."""
    cuda = cuda_in_use()
    if cuda is None:
        return None
    allocated, stack_before = at_start if at_start is not None else (0, None)
    stack = driver_stack()
    # charged only where it grew: the limit stays at the largest stack of the process
    grew = stack is not None and stack > max(stack_before or 0, DEFAULT_STACK)
    local = local_memory(stack) if grew else 0
    return int(cuda.max_memory_allocated()), allocated, allocated_after_collecting(allocated), alone, local


def from_properties(user_properties: Sequence[Tuple[str, Any]]) -> Optional[Measured]:
    """The measurement stored in a test report's ``user_properties`` (``None`` if absent)."""
    for key, value in user_properties:
        if key == PROPERTY:
            peak, at_start, left, alone, local = value
            return int(peak), int(at_start), int(left), bool(alone), int(local)
    return None


def _gib(n: int) -> float:
    return round(n / GIB, 3)


def as_json(measured: Optional[Measured]) -> Optional[Dict[str, Any]]:
    """One test's measurement for ``results.json`` (GiB, three decimals), ``None`` where not measured."""
    if measured is None:
        return None
    peak, at_start, left, alone, local = measured
    return {"peak_gib": _gib(peak), "start_gib": _gib(at_start), "left_gib": _gib(left), "alone": alone,
            "local_gib": _gib(local)}


def summary(outcomes: Iterable["TestOutcome"], share_gib: Optional[float], largest: int = LARGEST) -> Dict[str, Any]:
    """The report's ``gpu_memory``.

    Args:
        outcomes: the run's tests (those without a measurement are left out).
        share_gib: each worker's share of its GPU's memory where xdist workers share one
            (the device's memory over the workers on it), else ``None``.

    Returns ``tests`` (how many were measured), ``share_gib``, the ``largest`` peaks, the tests
    that peaked above the share beside others (``over_share``: each belongs under
    ``requires(memory_gib=...)``), those whose allocation grew by more than :data:`KEPT_GIB`
    (``kept``) and those whose kernels made the driver reserve more than :data:`LOCAL_GIB` of
    local memory (``local``)."""
    rows = [(o.nodeid, *o.gpu_memory) for o in outcomes if o.gpu_memory is not None]

    def entry(row: Tuple[Any, ...]) -> Dict[str, Any]:
        nodeid, peak, at_start, left, alone, local = row
        return {"nodeid": nodeid, "peak_gib": _gib(peak), "kept_gib": _gib(left - at_start), "alone": alone,
                "local_gib": _gib(local)}

    by_peak = sorted(rows, key=lambda r: (-r[1], r[0]))
    over = [] if share_gib is None else [r for r in by_peak if not r[4] and r[1] / GIB > share_gib]
    kept = sorted((r for r in rows if (r[3] - r[2]) / GIB > KEPT_GIB), key=lambda r: (r[2] - r[3], r[0]))
    local = sorted((r for r in rows if r[5] / GIB > LOCAL_GIB), key=lambda r: (-r[5], r[0]))
    return {"tests": len(rows), "share_gib": None if share_gib is None else round(share_gib, 3),
            "largest": [entry(r) for r in by_peak[:largest]], "over_share": [entry(r) for r in over],
            "kept": [entry(r) for r in kept], "local": [entry(r) for r in local]}


def share_of_device(memory_gib: Optional[float], gpus: int, workers: int) -> Optional[float]:
    """Each worker's share of a GPU's memory when ``workers`` xdist workers run on ``gpus`` GPUs
    and more than one lands on a GPU, else ``None``."""
    if memory_gib is None or gpus < 1 or workers <= gpus:
        return None
    return memory_gib / -(-workers // gpus)


def terminal_lines(memory: Dict[str, Any]) -> List[str]:
    """The terminal summary's lines: the largest peak, then every test over its share or
    keeping memory (empty where nothing was measured)."""
    if not memory["tests"]:
        return []
    top = memory["largest"][0]
    lines = [f"{memory['tests']} tests used the GPU; the largest peak: {top['peak_gib']:.2f} GiB, {top['nodeid']}"
             + (" (ran alone)" if top["alone"] else "")]
    share = memory["share_gib"]
    lines += [f"peaked at {r['peak_gib']:.2f} GiB beside other tests (share {share:.2f} GiB): {r['nodeid']}; "
              "mark it requires(memory_gib=...) to run it alone" for r in memory["over_share"]]
    lines += [f"left {r['kept_gib']:.2f} GiB allocated after its teardown: {r['nodeid']}" for r in memory["kept"]]
    lines += [f"its kernels' register spills made the driver reserve {r['local_gib']:.2f} GiB of local memory "
              f"(outside torch, until the process ends or the stack limit is reset): {r['nodeid']}"
              for r in memory["local"]]
    return lines
