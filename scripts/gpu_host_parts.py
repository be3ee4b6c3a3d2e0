"""The host's cost of the pieces an NSA call is made of, on the GPU machine's CPU: routing, the
public-op wrapper, an autograd Function, a Triton launch, torch allocations and small launches;
and the kernels and host time of one eager layer step (torch profiler).

Usage: ``python scripts/gpu_host_parts.py [--length 4096] [--trace-dir DIR]``; prints markdown.
"""

from __future__ import annotations

import argparse
import collections
import timeit
from pathlib import Path

import torch
import triton
import triton.language as tl

import nsa
from nsa import NSAAttention, routing


@triton.jit
def _touch(x_ptr, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
           C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, C4: tl.constexpr):
    tl.store(x_ptr + tl.program_id(0), a1 + C1)


def us(fn, number: int = 2000) -> float:
    fn()
    torch.cuda.synchronize()
    return min(timeit.repeat(fn, number=number, repeat=3)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--trace-dir", type=Path, default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    x = torch.zeros(1024, device=dev, dtype=torch.float32)
    small = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
    rows = [
        ("routing.resolve (one op)", lambda: routing.resolve("selected", dev, torch.bfloat16, None, 128)),
        ("triton launch, 16 args + 4 constexpr", lambda: _touch[(1,)](x, *range(1, 16), C1=1, C2=2, C3=3, C4=4)),
        ("torch.empty", lambda: torch.empty(4096, 64, 128, device=dev, dtype=torch.bfloat16)),
        ("torch.add (small)", lambda: small + small),
        ("F.linear (64x64)", lambda: torch.nn.functional.linear(small, small)),
        ("torch.compiler.disable wrapper (no-op fn)", torch.compiler.disable(lambda: None)),
        ("apply_rotary (64 heads, 1 token)", None),
    ]
    from nsa.modules.rotary import RotaryEmbedding

    q1 = torch.randn(1, 1, 64, 128, device=dev, dtype=torch.bfloat16)
    cos, sin = RotaryEmbedding(128).tables(torch.arange(1, device=dev), torch.bfloat16)
    rows[-1] = (rows[-1][0], lambda: nsa.ops.apply_rotary(q1, cos, sin))
    print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}\n")
    print("| piece | host us per call |")
    print("|---|---:|")
    for name, fn in rows:
        print(f"| {name} | {us(fn):.1f} |", flush=True)

    from torch.profiler import ProfilerActivity, profile

    dt = torch.bfloat16
    layer = NSAAttention(2048, 64, 4, 128).to(device=dev, dtype=dt)
    xin = torch.randn(1, args.length, 2048, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn_like(xin)
    cache = layer.new_cache(1, capacity=args.length + 64, static=True)
    with torch.no_grad():
        layer(xin.detach(), cache)
    token = torch.randn(1, 1, 2048, device=dev, dtype=dt)

    def step():
        with torch.no_grad():
            layer(token, cache)

    cases = {"layer_train": lambda: layer(xin).backward(dy), "decode": step}
    for name, fn in cases.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = collections.Counter(e.name for e in prof.events() if e.device_type.name == "CUDA")
        launches = sum(kernels.values())
        print(f"\n### {name}, T {args.length}: {launches} kernels on the device\n")
        print("| kernel | count |")
        print("|---|---:|")
        for kname, count in kernels.most_common(40):
            print(f"| {kname[:90]} | {count} |")
        print("\n```")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
        print("```")
        if args.trace_dir is not None:
            args.trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(args.trace_dir / f"host_trace_{name}.json"))


if __name__ == "__main__":
    main()
