"""Which tests leave GPU memory that torch's allocator does not know about (session 29).

A pytest plugin (``-p gpu_memory_probe``, with ``scripts/`` on PYTHONPATH; it runs in every xdist
worker). After every test it appends one line to ``$PROBE_OUT``: the process, the test, the device
memory this process holds outside torch's allocator (the CUDA context, library workspaces, and
the local memory the driver keeps for the largest per-thread stack any kernel launched so far
needed), the per-thread stack limit; then it sets the stack limit back to CUDA's default
(``pytest_nsa.gpu_memory.reset_driver_stack``, ``cuCtxSetLimit``) and gives the figure again:
whether that returns the local memory. (Session 29's run reset to the process's first limit
instead, which a process whose first test already grew it kept.)
Per process through NVML (``nvmlDeviceGetComputeRunningProcesses``, loaded by ctypes).

    PROBE_OUT=$OUT/probe.txt python -m pytest -n 12 -p gpu_memory_probe tests/ops/test_window_kernel.py
"""

from __future__ import annotations

import ctypes
import os

import pytest

from pytest_nsa.gpu_memory import driver_stack, reset_driver_stack

GIB = 2**30


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


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    import torch

    if not torch.cuda.is_initialized():
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pid = os.getpid()
    outside = _nvml_used(pid) - torch.cuda.memory_reserved() / GIB
    stack = driver_stack()
    reset = reset_driver_stack()
    after = _nvml_used(pid) - torch.cuda.memory_reserved() / GIB
    with open(os.environ.get("PROBE_OUT", "probe.txt"), "a") as f:
        f.write(f"{pid} {item.nodeid} outside_torch_gib {outside:.2f} stack {stack} "
                f"reset {reset} after_reset_gib {after:.2f} torch_peak_gib "
                f"{torch.cuda.max_memory_allocated() / GIB:.2f}\n")
