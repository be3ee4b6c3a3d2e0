"""Where a prefill step leaves the GPU idle: one forward+backward of ``nsa_attention`` queued
behind a device-side wait (so that the host's submission is never what the GPU waits for,
unless the host itself blocks), traced with the torch profiler. Prints the step's span, the
sum of its kernels and the largest gaps between consecutive kernels, with the kernels around
them. A gap here means the host stalled (a synchronisation or an allocation) inside the step.

Usage: ``python scripts/gpu_step_gaps.py [--lengths 8192 65536] [--top 8]``
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from nsa import NSAConfig
from nsa.bench.workloads import Shape, prefill_inputs
from nsa.ops import nsa_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    dev, config = torch.device("cuda"), NSAConfig()
    for T in args.lengths:
        torch.manual_seed(T)
        q, k, v, gates, do = prefill_inputs("nsa", Shape.default(dev, 1, T), dev, True)

        def step():
            return torch.autograd.grad(nsa_attention(q, k, v, gates, config, backend="triton"), (q, k, v, gates), do)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(200_000_000)  # ~100 ms of device wait: the host queues the whole step behind it
            step()
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)[1:]  # the first is the device wait
        starts = [e.time_range.start for e in kernels]
        ends = [e.time_range.end for e in kernels]
        busy = sum(e - s for s, e in zip(starts, ends))
        span = ends[-1] - starts[0]
        print(f"T={T}: step span {span / 1e3:.2f} ms, kernels {busy / 1e3:.2f} ms, {len(kernels)} kernels", flush=True)
        gaps = sorted(((starts[i] - ends[i - 1], i) for i in range(1, len(kernels))), reverse=True)[: args.top]
        for gap, i in gaps:
            print(f"T={T}   gap {gap / 1e3:7.3f} ms after {kernels[i - 1].name[:50]!r} before {kernels[i].name[:50]!r}",
                  flush=True)


if __name__ == "__main__":
    main()
