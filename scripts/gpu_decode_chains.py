"""Batch decode as several chains: can one part's selection overlap another part's compressed pass?

Once the batch fills the GPU, a decode step (``nsa_decode``) is four dependent launches. The
compressed pass streams most of the bytes at about 3.4 TB/s on an H200; after it, the score,
selected and combine launches take a third of the step while the DRAM moves little (the selected
blocks). This script splits the batch into ``C`` equal parts, each a whole ``nsa_decode`` of its
rows, and captures them in one CUDA graph on ``C`` streams (forked from and joined to the
capturing stream), with equal priorities or the first part's highest, so that a later part's
compressed pass can fill the SMs and the DRAM that an earlier part's tail leaves idle.

For each context and batch it prints, as markdown: the step as one chain (the library's), the
parts in turn on one stream, and the parts on streams of equal or falling priority; each as the
median of ``do_bench`` graph replays (L2 flushed, as the tables), with dense SDPA (cuDNN or the
fastest backend) over the whole cache in the same run. Every form's output is checked against
the one-chain step (relative error, selected blocks equal).

Usage: ``python scripts/gpu_decode_chains.py [--contexts 8192 65536] [--batches 16 32]
[--chains 2 4] [--launch JSON]`` (``--launch``: ``decode_fwd`` overrides for every part).
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict, List, Optional

import torch
from triton.testing import do_bench

from gpu_decode import dense_us, graph_of, make_inputs, parse_launch, run_nsa
from nsa.testing import rel_error


def part_of(t: Dict[str, torch.Tensor], lo: int, hi: int) -> Dict[str, torch.Tensor]:
    """Rows ``[lo, hi)`` of every input (views: the batch is the leading dimension)."""
    return {name: x[lo:hi] for name, x in t.items()}


def chains_step(parts: List[Dict[str, torch.Tensor]], streams: Optional[List[torch.cuda.Stream]],
                launch: dict) -> Callable[[], torch.Tensor]:
    """One step as the parts' ``nsa_decode`` calls: on the current stream in turn
    (``streams`` None), or each on its own stream, forked from and joined to the current one.
    Returns the outputs concatenated along the batch (one copy, after the join)."""

    def step() -> torch.Tensor:
        here = torch.cuda.current_stream()
        if streams is None:
            outs = [run_nsa(p, **launch)[0] for p in parts]
        else:
            outs = []
            for p, s in zip(parts, streams):
                s.wait_stream(here)
                with torch.cuda.stream(s):
                    outs.append(run_nsa(p, **launch)[0])
            for s in streams:
                here.wait_stream(s)
        return torch.cat(outs)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--chains", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--launch", type=parse_launch, default={}, metavar="JSON")
    args = parser.parse_args()
    low, high = torch.cuda.Stream.priority_range()  # (least, greatest): greater priority is lower
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; stream priorities {high} (high) to {low}")
    print(f"launch overrides of every part: {args.launch or 'none'}\n")
    print("| context | B | form | NSA us | dense us | dense / NSA | rel. err vs one chain | blocks equal |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for S in args.contexts:
        for B in args.batches:
            t = make_inputs(B, S)
            dense = min(dense_us(B, S).values())
            o_one, idx_one = run_nsa(t, **args.launch)
            forms = {"one chain": lambda: run_nsa(t, **args.launch)[0]}
            for C in args.chains:
                if B % C:
                    continue
                parts = [part_of(t, i * B // C, (i + 1) * B // C) for i in range(C)]
                forms[f"{C} parts in turn"] = chains_step(parts, None, args.launch)
                forms[f"{C} parts, {C} streams"] = chains_step(parts, [torch.cuda.Stream() for _ in parts], args.launch)
                # the first part highest; priorities clamp at the device's range
                ranked = [torch.cuda.Stream(priority=max(high, min(low, high + i))) for i in range(C)]
                forms[f"{C} parts, {C} streams, falling priority"] = chains_step(parts, ranked, args.launch)
            for name, fn in forms.items():
                out = fn()
                torch.cuda.synchronize()
                err = rel_error(out, o_one)
                graph = graph_of(fn)
                graph.replay()
                torch.cuda.synchronize()
                replay_err = rel_error(graph.output, o_one)
                us = 1e3 * do_bench(graph.replay, warmup=50, rep=300, return_mode="median")
                print(f"| {S} | {B} | {name} | {us:.1f} | {dense:.1f} | {dense / us:.2f}x | "
                      f"{max(err, replay_err):.1e} | |", flush=True)  # fmt: skip
            # the selected blocks of the parts, each called alone, against the one chain's
            if args.chains and B % args.chains[0] == 0:
                C = args.chains[0]
                idx = torch.cat([run_nsa(part_of(t, i * B // C, (i + 1) * B // C), **args.launch)[1] for i in range(C)])
                print(f"| {S} | {B} | blocks of {C} parts | | | | | {100 * float((idx == idx_one).float().mean()):.2f}% |")
            del t, forms
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
