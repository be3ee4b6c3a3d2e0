"""Peak GPU memory and time of the reference's forward+backward, with and without recomputing its
query chunks in the backward (`nsa.ops._reference.map_query_chunks`).

    python scripts/gpu_reference_memory.py [--shapes T:HQ:H:DK:DV ...] [--dtype float32]

For each shape: `nsa_attention(backend="reference")` on random bfloat16 inputs upcast to the
reference's dtype, as the real-size GPU tests call it, then the gradients of a random upstream
gradient; "kept" runs each chunk once and keeps its intermediates for the backward (the reference
before session 31), "recomputed" is the library's. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import torch

import nsa.ops._reference as reference_blocks
from nsa import NSAConfig, nsa_attention

# The real-size cases of the GPU tests (tests/ops/_kernel_inputs.py: GPU_SHAPE_CASES) and the
# prefill tests' 64-head case.
SHAPES = ("3001:16:16:128:128", "4099:64:4:128:128", "4173:64:4:128:128", "2053:16:1:192:128")


@contextmanager
def chunks_kept():
    """The reference as before session 31: every chunk's intermediates stay in the graph."""
    recompute = reference_blocks.checkpoint
    reference_blocks.checkpoint = lambda fn, *args, **_: fn(*args)
    try:
        yield
    finally:
        reference_blocks.checkpoint = recompute


def measure(shape: str, dtype: torch.dtype, device: torch.device):
    """``(peak GiB, seconds, gradients)`` of one forward+backward of the reference."""
    T, HQ, H, DK, DV = (int(x) for x in shape.split(":"))
    gen = torch.Generator(device).manual_seed(0)
    q = torch.randn(1, T, HQ, DK, device=device, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, T, H, DK, device=device, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, T, H, DV, device=device, generator=gen).to(torch.bfloat16)
    gates = torch.rand(1, T, HQ, 3, device=device, generator=gen).to(torch.bfloat16)
    do = torch.randn(1, T, HQ, DV, device=device, generator=gen, dtype=dtype)
    leaves = [x.to(dtype).requires_grad_() for x in (q, k, v, gates)]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    out = nsa_attention(*leaves, NSAConfig(), backend="reference")
    grads = torch.autograd.grad(out, leaves, do)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - before) / 2**30
    return peak, seconds, [g.detach() for g in grads]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="T:HQ:H:DK:DV")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, reference in {args.dtype}\n")
    measure("256:4:1:32:32", dtype, device)  # library and cuBLAS set-up, outside the table
    print("| T:HQ:H:DK:DV | kept: peak GiB | kept: s | recomputed: peak GiB | recomputed: s | gradients |")
    print("|---|---:|---:|---:|---:|---|")
    for shape in args.shapes:
        peak_new, seconds_new, grads_new = measure(shape, dtype, device)
        try:
            with chunks_kept():
                peak_old, seconds_old, grads_old = measure(shape, dtype, device)
        except torch.cuda.OutOfMemoryError:
            old, same = "out of memory | -", "-"
        else:
            old = f"{peak_old:.2f} | {seconds_old:.2f}"
            worst = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads_new, grads_old))
            same = f"relative difference <= {worst:.1e}"
        torch.cuda.empty_cache()
        print(f"| {shape} | {old} | {peak_new:.2f} | {seconds_new:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
