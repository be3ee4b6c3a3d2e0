"""Which tests leave GPU memory that torch's allocator does not know about (session 29).

Runs the given pytest arguments in this one process and prints, after every test, the device
memory in use less torch's reserved memory (the CUDA context, cuBLAS workspaces, and the local
memory the driver keeps for the largest per-thread stack any kernel launched so far needed),
and the per-thread stack limit. At the end it sets the stack limit back to its first value
(cuCtxSetLimit) and prints the figure again: whether that returns the local memory.

    python scripts/gpu_memory_probe.py tests/ops/test_window_kernel.py -k gpu
"""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

GIB = 2**30
CU_LIMIT_STACK_SIZE = 0


def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def stack_limit() -> int:
    value = ctypes.c_size_t()
    _libcuda().cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_STACK_SIZE)
    return value.value


def outside_torch() -> float:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / GIB


class Probe:
    def __init__(self) -> None:
        self.first_stack = None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item):
        if not torch.cuda.is_initialized():
            return
        if self.first_stack is None:
            self.first_stack = stack_limit()
        print(f"\nPROBE {item.nodeid}: outside torch {outside_torch():.2f} GiB, stack limit {stack_limit()} B, "
              f"torch peak {torch.cuda.max_memory_allocated() / GIB:.2f} GiB", flush=True)
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    probe = Probe()
    code = pytest.main(["-q", "-s", "-p", "no:cacheprovider", "--gpu-profile", "auto", *sys.argv[1:]], plugins=[probe])
    if torch.cuda.is_initialized():
        before = outside_torch()
        rc = _libcuda().cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(probe.first_stack or 1024))
        print(f"PROBE end: outside torch {before:.2f} GiB; cuCtxSetLimit(stack, {probe.first_stack}) -> {rc}; "
              f"outside torch now {outside_torch():.2f} GiB, stack limit {stack_limit()} B", flush=True)
    sys.exit(code)
