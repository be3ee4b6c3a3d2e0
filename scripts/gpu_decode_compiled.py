"""One decode step of an ``NSAAttention`` layer four ways, as a generation loop runs it (host and
device together): eager; ``torch.compile`` (default mode); ``torch.compile(mode="reduce-overhead")``,
whose CUDA graphs write into the static cache's buffers (marked static addresses); and
:class:`nsa.DecodeGraph`, the library's own captured step.

Each way: a static cache prefilled eagerly to the context, 5 warm-up steps, then ``--steps`` steps
back to back between two CUDA events (ms per step, the mean); the outputs of the last step are
compared with eager's (relative error). Also the CUDA graphs that Inductor recorded, and the runs
it skipped.

Usage: ``python scripts/gpu_decode_compiled.py [--contexts 4096,32768] [--batch 1] [--steps 100]
[--ways eager,compiled,reduce-overhead,DecodeGraph]``;
prints markdown.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict

import torch

from nsa import DecodeGraph, NSAAttention
from nsa.testing import recorded_cuda_graphs, rel_error

HIDDEN, HQ, H, D = 2048, 64, 4, 128


def run_steps(layer: NSAAttention, context: int, batch: int, steps: int, way: str,
              tokens: torch.Tensor) -> Dict[str, object]:
    cache = layer.new_cache(batch, capacity=context + steps + 8, static=True)
    torch.manual_seed(1)
    prompt = torch.randn(batch, context, HIDDEN, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer(prompt, cache)
    step: Callable[[torch.Tensor], torch.Tensor]
    first = time.perf_counter()
    if way == "eager":
        step = lambda x: layer(x, cache)  # noqa: E731
    elif way == "DecodeGraph":
        graph = DecodeGraph(layer, cache)
        step = graph
    else:
        torch._dynamo.reset()
        compiled = torch.compile(layer, mode=None if way == "compiled" else way)

        def step(x):
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(x, cache)

    out = None
    with torch.no_grad():
        for i in range(5):
            out = step(tokens[i])
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - first
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(steps):
            out = step(tokens[5 + i])
        e1.record()
        e1.synchronize()
    return {"ms": e0.elapsed_time(e1) / steps, "warm_s": warm_s, "last": out.clone(), "graphs": recorded_cuda_graphs()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="4096,32768")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--ways", default="eager,compiled,reduce-overhead,DecodeGraph")
    args = parser.parse_args()
    from torch._dynamo.utils import counters

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}; "
          f"bf16, hidden {HIDDEN}, HQ {HQ}, H {H}, D {D}, batch {args.batch}, {args.steps} steps\n")  # fmt: skip
    print("| context | way | ms per step | warm-up s (5 steps, compile) | rel. error of the last step vs eager "
          "| CUDA graphs recorded | runs without CUDA graphs |")
    print("|---:|---|---:|---:|---|---:|---:|")
    torch.manual_seed(0)
    layer = NSAAttention(HIDDEN, HQ, H, D).to(device="cuda", dtype=torch.bfloat16)
    for context in (int(c) for c in args.contexts.split(",")):
        tokens = torch.randn(5 + args.steps, args.batch, 1, HIDDEN, device="cuda", dtype=torch.bfloat16)
        base = None
        for way in args.ways.split(","):
            counters.clear()
            try:
                got = run_steps(layer, context, args.batch, args.steps, way, tokens)
            except Exception as exc:  # noqa: BLE001 - a way that fails is reported, the others still run
                print(f"| {context} | {way} | failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]} | | | | |")
                continue
            base = got["last"] if way == "eager" else base
            err = rel_error(got["last"], base) if base is not None else float("nan")
            skips = counters["inductor"]["cudagraph_skips"]
            print(f"| {context} | {way} | {got['ms']:.3f} | {got['warm_s']:.1f} | {err:.2e} | {got['graphs']} | {skips} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
