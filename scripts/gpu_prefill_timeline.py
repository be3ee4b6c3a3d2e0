"""Where a prefill call's device time goes between its kernels: the table's timing beside the
kernels' own time, the idle gaps on the device's timeline and what the host did meanwhile.

Why: on the H200 (session 53) the kernels of one 64k forward+backward added up to 94.6 ms while
the table's call took 98.3: about 4 % of the step is not in any kernel. This probe times the
call as the table does (``nsa.bench``'s queued runner: calls back to back, L2 flushed before each),
then profiles the same calls (torch profiler, CUDA activity) and reads the trace:

- per call, the span from its first kernel to its last, the kernels' union within it, and the
  idle rest;
- the longest idle gaps, each with the kernels on both sides;
- the host's CUDA runtime and driver calls that can stall the queue (allocation, frees,
  synchronisations, copies), counted per call with their time;
- the caching allocator's counters over the timed calls (device allocations, frees, retries).

Usage: ``python scripts/gpu_prefill_timeline.py [--lengths 8192 65536] [--calls 4] [--gaps 12]
[--forward]``; prints Markdown-ish text. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections import Counter, defaultdict
from typing import Dict, List, Tuple

import torch

from nsa.bench.timing import measure
from nsa.bench.workloads import Shape, default_config, prefill_runner

#: Host calls that can leave the device idle: they wait for it, or allocate and free its memory.
STALLING = ("Malloc", "Free", "Synchronize", "Memcpy", "MemGetInfo", "HostAlloc")
#: Allocator counters read before and after the timed calls.
ALLOC_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def _kernels(trace: dict) -> List[Tuple[float, float, str, str]]:
    """``(start us, end us, name, grid)`` of every device activity (kernels, copies, memsets), by start."""
    spans = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            start = float(ev["ts"])
            grid = str(ev.get("args", {}).get("grid", ""))
            spans.append((start, start + float(ev.get("dur", 0.0)), ev.get("name", "?"), grid))
    return sorted(spans)


def _host_calls(trace: dict) -> List[Tuple[float, float, str]]:
    calls = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") in ("cuda_runtime", "cuda_driver"):
            name = ev.get("name", "?")
            if any(word in name for word in STALLING):
                calls.append((float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0)), name))
    return sorted(calls)


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _split_calls(spans: List[Tuple[float, float, str, str]], calls: int) -> List[List[Tuple[float, float, str]]]:
    """The device activities of each call. The runner's L2 flushes separate them, fills of one name
    and grid: the profiled window opens with one (the runner flushes before each call), and they
    come once a call. A call's own fills may be as long, but not first (session 60's first splitter
    took the long fills and cut each 64k call in two at one of the backward's)."""
    first = spans[0] if spans else None
    if first is None or "fill" not in first[2].lower():
        raise ValueError("the profiled window does not open with the runner's L2 flush (a fill kernel)")
    flush = first[2:]
    count = sum(1 for span in spans if span[2:] == flush)
    if count != calls:
        raise ValueError(f"found {count} fills like the first flush, for {calls} calls")
    per_call: List[List[Tuple[float, float, str]]] = [[]]
    for s, e, name, grid in spans:
        if (name, grid) == flush:
            if per_call[-1]:
                per_call.append([])
            continue
        per_call[-1].append((s, e, name))
    return [c for c in per_call if c]


def _union(spans: List[Tuple[float, float, str]]) -> float:
    busy, end = 0.0, float("-inf")
    for s, e, _ in spans:
        if e <= end:
            continue
        busy += e - max(s, end)
        end = e
    return busy


def probe(T: int, forward_only: bool, calls: int, gaps: int) -> None:
    device = torch.device("cuda")
    shape = Shape.default(device, 1, T)
    config = default_config(device)
    runner = prefill_runner("nsa", shape, config, device, backward=not forward_only, queued=True)
    what = "forward" if forward_only else "forward+backward"
    measure(runner, rounds=2, warmup=0)  # compile and warm the allocator
    before = torch.cuda.memory_stats(device)
    timed = measure(runner, rounds=calls, warmup=0)
    after = torch.cuda.memory_stats(device)
    counters = ", ".join(f"{k} +{after.get(k, 0) - before.get(k, 0)}" for k in ALLOC_COUNTERS)
    print(f"\n## T={T} {what}: table timing (queued, L2 flushed) median {timed.median * 1e3:.3f} ms "
          f"over {calls} calls; allocator over them: {counters}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            measure(runner, rounds=calls, warmup=0)
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    spans = _kernels(trace)
    per_call = _split_calls(spans, calls)
    host = _host_calls(trace)
    print(f"profiled: {len(per_call)} calls found between the flushes (of {calls})", flush=True)
    gap_list = []
    for i, call in enumerate(per_call):
        span = call[-1][1] - call[0][0]
        busy = _union(call)
        kernel_sum = sum(e - s for s, e, _ in call)
        print(f"call {i}: span {span / 1e3:.3f} ms, kernels' union {busy / 1e3:.3f} ms (sum {kernel_sum / 1e3:.3f}), "
              f"idle {(span - busy) / 1e3:.3f} ms, {len(call)} device activities", flush=True)
        end = call[0][1]
        prev = call[0][2]
        for s, e, name in call[1:]:
            if s > end:
                gap_list.append((s - end, i, prev, name, end, s))
            if e > end:
                end, prev = e, name
    gap_list.sort(reverse=True)
    print("longest idle gaps (us; call; after -> before):")
    for g, i, prev, nxt, g0, g1 in gap_list[:gaps]:
        during = Counter(n for s, e, n in host if s < g1 and e > g0)
        extra = f"; host meanwhile: {dict(during)}" if during else ""
        print(f"  {g:9.1f}  call {i}: {_short(prev, 50)} -> {_short(nxt, 50)}{extra}")
    gap_sizes = [g for g, *_ in gap_list]
    if gap_sizes:
        print(f"gaps: {len(gap_sizes)}, median {statistics.median(gap_sizes):.1f} us, "
              f"sum {sum(gap_sizes) / 1e3:.3f} ms over {len(per_call)} calls", flush=True)
    totals: Dict[str, List[float]] = defaultdict(list)
    for s, e, name in host:
        totals[name].append(e - s)
    print("host calls that can stall the queue (count per call, total us per call, longest us):")
    n = max(len(per_call), 1)
    for name, durs in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {name}: {len(durs) / n:.1f}, {sum(durs) / n:.1f}, {max(durs):.1f}")
    by_kernel: Dict[str, float] = defaultdict(float)
    for call in per_call:
        for s, e, name in call:
            by_kernel[name] += (e - s) / n
    print("device time by kernel (ms per call):")
    for name, t in sorted(by_kernel.items(), key=lambda kv: -kv[1])[:24]:
        print(f"  {t / 1e3:8.3f}  {_short(name, 90)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--gaps", type=int, default=12)
    parser.add_argument("--forward", action="store_true", help="the forward under no_grad as well")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_prefill_timeline.py needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    for T in args.lengths:
        if args.forward:
            probe(T, True, args.calls, args.gaps)
        probe(T, False, args.calls, args.gaps)


if __name__ == "__main__":
    main()
