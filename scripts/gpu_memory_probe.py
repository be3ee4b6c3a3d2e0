"""Which tests leave GPU memory that torch's allocator does not know about (session 29).

A pytest plugin (``-p gpu_memory_probe``, with ``scripts/`` on PYTHONPATH; it runs in every xdist
worker). After every test it appends one line to ``$PROBE_OUT``: the process, the test, the device
memory this process holds outside torch's allocator (the CUDA context, library workspaces, and
the local memory the driver keeps for the largest per-thread stack any kernel launched so far
needed), the per-thread stack limit; then it sets the stack limit back to the process's first
value (``cuCtxSetLimit``) and gives the figure again: whether that returns the local memory.
Per process through NVML (``nvmlDeviceGetComputeRunningProcesses``, loaded by ctypes).

    PROBE_OUT=$OUT/probe.txt python -m pytest -n 12 -p gpu_memory_probe tests/ops/test_window_kernel.py
"""

from __future__ import annotations

import ctypes
import os

import pytest

GIB = 2**30
CU_LIMIT_STACK_SIZE = 0
_first_stack = None


class _Process(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def _nvml_used(pid: int) -> float:
    """GiB this process holds on GPU 0 as NVML reports it (-1 where NVML cannot tell)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        nvml.nvmlInit_v2()
        handle = ctypes.c_void_p()
        nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
        count = ctypes.c_uint(64)
        procs = (_Process * 64)()
        nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), procs)
        return next((p.usedGpuMemory / GIB for p in procs[: count.value] if p.pid == pid), -1.0)
    except OSError:
        return -1.0


def _stack(libcuda) -> int:
    value = ctypes.c_size_t()
    libcuda.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_STACK_SIZE)
    return value.value


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    global _first_stack
    import torch

    if not torch.cuda.is_initialized():
        return
    libcuda = ctypes.CDLL("libcuda.so.1")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pid = os.getpid()
    if _first_stack is None:
        _first_stack = _stack(libcuda)
    outside = _nvml_used(pid) - torch.cuda.memory_reserved() / GIB
    stack = _stack(libcuda)
    rc = libcuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(_first_stack))
    after = _nvml_used(pid) - torch.cuda.memory_reserved() / GIB
    with open(os.environ.get("PROBE_OUT", "probe.txt"), "a") as f:
        f.write(f"{pid} {item.nodeid} outside_torch_gib {outside:.2f} stack {stack} "
                f"reset_rc {rc} after_reset_gib {after:.2f} torch_peak_gib "
                f"{torch.cuda.max_memory_allocated() / GIB:.2f}\n")
