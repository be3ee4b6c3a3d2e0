"""Where one CUDA-graph decode step spends its time: each kernel's start and end inside a replay.

The decode benchmarks time whole replays. This prints, for a few replays of the default launch
(the L2 flushed before each, as the benchmarks do), every decode kernel's start and duration
relative to the first one's start, and the idle gaps between them, from the torch profiler's
CUPTI records of the graph's kernels. With programmatic dependent launch a kernel starts before
the one it waits for ends: its span then includes that wait, and "overlap" is negative gap.

Usage: ``python scripts/gpu_decode_timeline.py [--contexts 8192 65536] [--batches 1 16] [--replays 5]
[--variants '{}' '{"splits": [32, 4, 1]}']``: each variant is a JSON dict of
:func:`nsa.ops.decode.kernel.decode_fwd` overrides (``{}``, the default, is the entry point's launch).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from typing import Dict, List, Tuple

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_decode import graph_of, make_inputs, run_nsa


def replay_spans(B: int, S: int, replays: int, launch: dict) -> List[List[Tuple[str, float, float]]]:
    """``[(kernel, start us, end us)]`` of the decode kernels of each replay, start-ordered
    (``launch``: decode_fwd overrides, none for the entry point's own launch)."""
    t = make_inputs(B, S)
    graph = graph_of(lambda: run_nsa(t, **launch))
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(5):
        flush.zero_()
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            flush.zero_()
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    out, current = [], []
    for e in kernels:
        if "decode" in e.name:
            current.append((e.name.replace("decode_", "").replace("_kernel", ""), e.time_range.start, e.time_range.end))
        elif current:  # the flush of the next replay
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def summary(spans: List[List[Tuple[str, float, float]]]) -> str:
    """Median start, duration and gap to the previous kernel's end, per kernel of the chain."""
    by: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    order: List[str] = []
    total = []
    for replay in spans:
        t0 = replay[0][1]
        total.append(replay[-1][2] - t0)
        prev_end = None
        for name, start, end in replay:
            if name not in order:
                order.append(name)
            by[name]["start"].append(start - t0)
            by[name]["dur"].append(end - start)
            by[name]["gap"].append(0.0 if prev_end is None else start - prev_end)
            prev_end = end
    lines = [f"first kernel start to last kernel end: median {statistics.median(total):.1f} us "
             f"(min {min(total):.1f}, max {max(total):.1f}, {len(total)} replays)"]
    for name in order:
        m = {k: statistics.median(v) for k, v in by[name].items()}
        lines.append(f"  {name:>16}: start {m['start']:6.1f}  span {m['dur']:6.1f}  gap after previous end {m['gap']:6.1f} us")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=["{}"], help="JSON dicts of decode_fwd overrides")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}")
    for B in args.batches:
        for S in args.contexts:
            for variant in args.variants:
                launch = json.loads(variant)
                print(f"B={B} S={S} {variant}: {summary(replay_spans(B, S, args.replays, launch))}", flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
