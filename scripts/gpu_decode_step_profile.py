"""Where one decode step of an ``NSAAttention`` layer spends its device time, replayed as a CUDA
graph two ways: :class:`nsa.DecodeGraph` (the eager step captured) and
``torch.compile(mode="reduce-overhead")`` (Inductor's code, captured by its cudagraph trees).
The torch profiler lists each kernel inside the replays: name, launches a step, microseconds a step.

Usage: ``python scripts/gpu_decode_step_profile.py [--context 4096] [--steps 20]``; prints markdown.
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from nsa import DecodeGraph, NSAAttention

HIDDEN, HQ, H, D = 2048, 64, 4, 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    layer = NSAAttention(HIDDEN, HQ, H, D).to(device="cuda", dtype=torch.bfloat16)
    prompt = torch.randn(1, args.context, HIDDEN, device="cuda", dtype=torch.bfloat16)
    token = torch.randn(1, 1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, hidden {HIDDEN}, HQ {HQ}, "
          f"H {H}, D {D}, batch 1, context {args.context}\n")  # fmt: skip
    for way in ("DecodeGraph", "reduce-overhead"):
        cache = layer.new_cache(1, capacity=args.context + 4 * args.steps, static=True)
        with torch.no_grad():
            layer(prompt, cache)
            if way == "DecodeGraph":
                step = DecodeGraph(layer, cache)
            else:
                compiled = torch.compile(layer, mode="reduce-overhead")

                def step(x=None):
                    torch.compiler.cudagraph_mark_step_begin()
                    return compiled(token, cache)

            for _ in range(5):
                step(token)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    step(token)
                torch.cuda.synchronize()
        kernels = collections.defaultdict(lambda: [0, 0.0])
        for event in prof.events():
            if event.device_type.name == "CUDA":
                kernels[event.name][0] += 1
                kernels[event.name][1] += event.device_time
        total = sum(us for _, us in kernels.values()) / args.steps
        launches = sum(n for n, _ in kernels.values()) / args.steps
        print(f"### {way}: {launches:.0f} kernels a step, {total:.1f} us of kernel time a step\n")
        print("| kernel | a step | us a step |")
        print("|---|---:|---:|")
        for name, (count, us) in sorted(kernels.items(), key=lambda item: -item[1][1]):
            print(f"| {name[:100]} | {count / args.steps:g} | {us / args.steps:.1f} |")
        print()


if __name__ == "__main__":
    main()
