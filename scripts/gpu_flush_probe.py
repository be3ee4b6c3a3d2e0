"""How the L2 flush before each timed replay changes the decode numbers (NSA and dense alike).

``triton.testing.do_bench`` (and so ``nsa.bench``) flushes the L2 by zeroing a 256 MB buffer.
That leaves up to the L2's size of dirty lines, whose write-back then runs inside the timed
replay. This script times the same CUDA graphs three ways:
- ``zero``: that flush;
- ``read``: a flush by reading the buffer, which also evicts the inputs but leaves nothing dirty;
- ``none``: no flush.

Each graph is one ``nsa_decode`` step, or dense SDPA over the whole cache. Medians of ``--reps``
replays, timed with CUDA events.

Usage: ``python scripts/gpu_flush_probe.py [--batches 16 1] [--contexts 65536] [--reps 300]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode import dense_inputs, graph_of, make_inputs, run_nsa  # noqa: E402


def median_us(graph: torch.cuda.CUDAGraph, flush: str, buf: torch.Tensor, reps: int) -> float:
    times = []
    for _ in range(reps):
        if flush == "zero":
            buf.zero_()
        elif flush == "read":
            buf.sum()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--contexts", type=int, nargs="+", default=[65536])
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args()
    buf = torch.empty(256 * 2**20 // 4, device="cuda", dtype=torch.int32)
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}")
    print("| B | context | flush | NSA us | dense us | dense / NSA |\n|---|---|---|---:|---:|---:|")
    for S in args.contexts:
        for B in args.batches:
            t = make_inputs(B, S)
            nsa = graph_of(lambda: run_nsa(t))
            q, K, V = dense_inputs(B, S)
            dense = graph_of(lambda: F.scaled_dot_product_attention(q, K, V, enable_gqa=True))
            for flush in ("zero", "read", "none"):
                n, d = median_us(nsa, flush, buf, args.reps), median_us(dense, flush, buf, args.reps)
                print(f"| {B} | {S} | {flush} | {n:.1f} | {d:.1f} | {d / n:.2f}x |", flush=True)
            del t, K, V, nsa, dense
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
