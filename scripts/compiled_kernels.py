"""Resources of compiled Triton kernels, for the GPU probes (``scripts/gpu_*_probe.py``)."""

from __future__ import annotations

from typing import List


def resources(fn) -> List[str]:
    """Warps, stages, registers, spills and shared memory of each variant of the Triton function
    ``fn`` compiled so far in this process."""
    out = []
    for entry in getattr(fn, "device_caches", {}).values():
        for compiled in entry[0].values():  # the kernel cache, first in every Triton 3.x entry
            if hasattr(compiled, "_init_handles"):
                compiled._init_handles()  # loads the binary, which sets n_regs and n_spills
            meta = compiled.metadata
            out.append(f"warps {getattr(meta, 'num_warps', '?')}, stages {getattr(meta, 'num_stages', '?')}, "
                       f"regs {getattr(compiled, 'n_regs', '?')}, spills {getattr(compiled, 'n_spills', '?')}, "
                       f"shared {getattr(meta, 'shared', '?')} B")
    return out
