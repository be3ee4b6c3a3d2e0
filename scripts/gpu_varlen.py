"""Packed batches (``cu_seqlens``) on the GPU: what a packed step costs, and how the length
classes trade padding for batches.

``nsa_attention(..., cu_seqlens=...)`` runs a pack as one padded batch per length class
(``nsa/ops/varlen.py``). Narrow classes pad less and run more batches, each a whole pipeline
of launches. This script times whole packs of 64k tokens (bf16, HQ 64, H 4, D 128, paper
defaults; forward and forward+backward), drawn as a data loader packs documents, under:

- each class width of ``--widths`` (classes per octave), ``default`` (the library's own grouping,
  whatever its version: with ``--src`` another tree's nsa runs, e.g. an older commit's), and
  ``dp``: sorted lengths cut where a cost model is least (``n * (L + L^2 / 78k)`` tokens' worth
  for n sequences padded to L, plus a fixed cost a batch; constants from the H100's prefill
  table);
- ``cu_seqlens`` on the GPU (read back each call: a sync) and on the host (``--boundaries``).

Every variant is checked against the first (outputs: relative error; selected blocks: share
equal). Dense attention over the same pack, ``torch.nn.attention.varlen.varlen_attn`` (flash,
causal), is timed too (``--no-dense`` skips it). Timing: ``nsa.bench.timing`` (L2 flushed, calls
queued back to back, medians). ``--trace`` instead traces one step a grouping with the torch
profiler (kernels by name, the host's submission, stalls); ``--host-profile`` runs cProfile
over the host's side.

Usage: ``python scripts/gpu_varlen.py [--total 65536] [--packs lognormal,...] [--widths default,1,2]
[--boundaries gpu,host] [--src DIR]``; prints markdown. ``--device cpu`` smoke-tests the script.
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
from pathlib import Path
from typing import Callable, Dict, List

import torch

# The packs (and their boundaries) come from this checkout whatever tree is timed: --src DIR (read
# before the imports) times another tree's nsa, e.g. an older commit's (git archive).
_HERE = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, _HERE)
from nsa.bench.workloads import pack_lengths  # noqa: E402
from nsa.ops.varlen import cu_seqlens_of  # noqa: E402

_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else _HERE
if Path(_SRC).resolve() != Path(_HERE).resolve():
    for name in [m for m in sys.modules if m == "nsa" or m.startswith("nsa.")]:
        del sys.modules[name]
    sys.path.insert(0, _SRC)
from nsa import NSAConfig  # noqa: E402
from nsa.bench.timing import Runner, measure_within  # noqa: E402
from nsa.ops import nsa_attention, varlen  # noqa: E402

HQ, H, D = 64, 4, 128
CONFIG = NSAConfig()
QUAD_TOKENS = 78_000  # H100 fit of the prefill table: time ~ T + T^2 / 78k tokens' worth
GROUP_TOKENS = 350  # a group's fixed cost in tokens' worth (about 0.3 ms of a forward+backward)


def dp_groups(lengths: List[int], group_tokens: int = GROUP_TOKENS) -> List[List[int]]:
    """Sorted lengths cut into groups of least modelled cost (see the module docstring)."""
    order = sorted((n, i) for i, n in enumerate(lengths) if n > 0)
    work = lambda n: n + n * n / QUAD_TOKENS  # noqa: E731
    best, cut = [0.0] + [math.inf] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        for i in range(j):
            cost = best[i] + (j - i) * work(order[j - 1][0]) + group_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], len(order)
    while j:
        groups.append(sorted(i for _, i in order[cut[j]:j]))
        j = cut[j]
    return groups[::-1]


def grouping(width: str) -> Callable[..., List[List[int]]]:
    """The grouping that ``width`` names; ``default`` is the library's own (any version)."""
    if width == "default":
        return ORIGINAL_CLASSES
    if width == "dp":
        return lambda lengths, per_octave=None: dp_groups(lengths)
    return lambda lengths, per_octave=None: ORIGINAL_CLASSES(lengths, int(width))


def use_grouping(width: str) -> None:
    """Groups packs by ``width`` from now on (layouts kept from another grouping dropped)."""
    varlen.length_classes = grouping(width)
    if hasattr(varlen, "_layout_of"):  # trees before session 34 keep no layouts
        varlen._layout_of.cache_clear()


ORIGINAL_CLASSES = varlen.length_classes
LABELS = {"dp": "cost model", "default": "library default"}


def inputs(lengths: List[int], backward: bool, device: torch.device):
    total = sum(lengths)
    like = dict(device=device, dtype=torch.bfloat16)
    q, k, v = (torch.randn(1, total, n, D, **like) for n in (HQ, H, H))
    gates = torch.rand(1, total, HQ, 3, **like)
    cu = cu_seqlens_of(lengths).to(device)
    args = [x.requires_grad_(backward) for x in (q, k, v, gates)]
    return args, cu


def nsa_fn(cu: torch.Tensor, backward: bool):
    def run(q, k, v, gates, do=None):
        if not backward:
            with torch.no_grad():
                return nsa_attention(q, k, v, gates, CONFIG, cu_seqlens=cu)
        with torch.enable_grad():
            return torch.autograd.grad(nsa_attention(q, k, v, gates, CONFIG, cu_seqlens=cu), (q, k, v, gates), do)
    return run


def dense_fn(cu: torch.Tensor, longest: int, backward: bool):
    """``(run, kv_heads)``: causal flash attention over the pack, and the key/value heads it takes
    (all ``HQ`` where this torch's ``varlen_attn`` has no GQA: the timed call then gets keys and
    values repeated beforehand); ``(None, 0)`` where this torch has no ``varlen_attn``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, 0
    params = inspect.signature(varlen_attn).parameters
    kw = dict(is_causal=True) if "is_causal" in params else dict(window_size=(-1, 0))
    if "enable_gqa" in params:
        kw["enable_gqa"] = True

    def run(q, k, v, do=None):
        call = lambda: varlen_attn(q[0], k[0], v[0], cu, cu, longest, longest, **kw)  # noqa: E731
        if not backward:
            with torch.no_grad():
                return call()
        with torch.enable_grad():
            return torch.autograd.grad(call(), (q, k, v), do[0])
    return run, (H if "enable_gqa" in params else HQ)


def timed(fn, args, device, budget: float) -> float:
    samples = measure_within(Runner(fn, [args], device, queued=True), rounds=30, warmup=3, budget_s=budget)
    return samples.median * 1e3


def trace(kind: str, lengths: List[int], widths: List[str], device: torch.device, where: str) -> None:
    """Where a packed forward+backward's time goes: kernels, host submission, host stalls."""
    import time

    from torch.profiler import ProfilerActivity, profile

    print(f"## pack `{kind}`: {len(lengths)} sequences, one forward+backward, boundaries on the {where}\n")
    print("| grouping | batches | kernels | kernels' device ms | host submits in ms | span behind a device wait ms "
          "| idle start to done ms | largest gap ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    args, cu = inputs(lengths, True, device)
    args = args + [torch.randn(1, sum(lengths), HQ, D, device=device, dtype=torch.bfloat16)]
    step = nsa_fn(cu.cpu() if where == "host" else cu, True)
    tops = []
    for width in widths:
        use_grouping(width)
        try:
            groups = varlen.length_classes(lengths)
            for _ in range(3):
                step(*args)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(*args)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda._sleep(400_000_000)  # the host queues the step behind this wait, unless it blocks
                step(*args)
                torch.cuda.synchronize()
            kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                             key=lambda e: e.time_range.start)[1:]
            starts = [e.time_range.start for e in kernels]
            ends = [e.time_range.end for e in kernels]
            busy = sum(e - s for s, e in zip(starts, ends)) / 1e3
            gap = max((starts[i] - ends[i - 1] for i in range(1, len(kernels))), default=0) / 1e3
            label = LABELS.get(width, f"{width} a octave")
            print(f"| {label} | {len(groups)} | {len(kernels)} | {busy:.2f} | {(t1 - t0) * 1e3:.2f} | "
                  f"{(ends[-1] - starts[0]) / 1e3:.2f} | {(t2 - t0) * 1e3:.2f} | {gap:.2f} |", flush=True)
            by_name: Dict[str, float] = {}
            for e in kernels:
                by_name[e.name[:60]] = by_name.get(e.name[:60], 0.0) + (e.time_range.end - e.time_range.start) / 1e3
            tops.append((label, sorted(by_name.items(), key=lambda x: -x[1])[:10]))
        finally:
            use_grouping("default")
    for label, top in tops:
        print(f"\n{label}, the kernels with the most device time (ms): "
              + "; ".join(f"`{name}` {ms:.2f}" for name, ms in top))
    print()


def host_profile(kind: str, lengths: List[int], width: str, where: str, device: torch.device) -> None:
    """The host's share: cProfile over five forward+backward calls after three warm ones."""
    import cProfile
    import io
    import pstats

    args, cu = inputs(lengths, True, device)
    args = args + [torch.randn(1, sum(lengths), HQ, D, device=device, dtype=torch.bfloat16)]
    step = nsa_fn(cu.cpu() if where == "host" else cu, True)
    use_grouping(width)
    try:
        for _ in range(3):
            step(*args)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            step(*args)
        prof.disable()
        torch.cuda.synchronize()
    finally:
        use_grouping("default")
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(30)
        print(f"## pack `{kind}`, {width} a octave, boundaries on the {where}: five forward+backward calls by {key}\n")
        print("```\n" + text.getvalue().strip() + "\n```\n", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total", type=int, default=65536)
    ap.add_argument("--packs", default="lognormal,long,uniform,one_long")
    ap.add_argument("--widths", default="default,1,2,4,dp",
                    help="classes per octave to compare, dp (the cost model), default (the library's own)")
    ap.add_argument("--no-dense", action="store_true", help="skip dense varlen_attn")
    ap.add_argument("--src", default=_SRC, help="the nsa tree to time (its src folder)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timing a cell")
    ap.add_argument("--boundaries", default="gpu,host",
                    help="where cu_seqlens lives: gpu (read back each call: a sync), host (no sync)")
    ap.add_argument("--device", default="cuda", help="cpu runs the reference: a smoke test of the script")
    ap.add_argument("--host-profile", action="store_true",
                    help="instead of timing: cProfile of the host's work in forward+backward calls (first width, "
                         "first boundaries), the functions with the most time")
    ap.add_argument("--trace", action="store_true",
                    help="instead of timing: one forward+backward a grouping, its kernels' device time, "
                         "the host's time to submit it and the step's span behind a device wait")
    opts = ap.parse_args()
    device = torch.device(opts.device)
    torch.manual_seed(opts.seed)
    widths = opts.widths.split(",")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"nsa from {opts.src}")
    print(f"device: {name}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}; {opts.total} tokens a pack, bf16, HQ {HQ}, H {H}, D {D}\n")
    for kind in opts.packs.split(","):
        lengths = pack_lengths(kind, opts.total, opts.seed)
        if opts.host_profile:
            host_profile(kind, lengths, widths[0], opts.boundaries.split(",")[0], device)
            continue
        if opts.trace:
            for where in opts.boundaries.split(","):
                trace(kind, lengths, widths, device, where)
            continue
        ordered = sorted(lengths)
        print(f"## pack `{kind}`: {len(lengths)} sequences, lengths {ordered[0]}..{ordered[-1]}, "
              f"median {ordered[len(ordered) // 2]}\n")
        print("| grouping | batches | padded / real positions | forward ms | forward+backward ms | "
              "o vs first (rel.) | blocks equal |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        eval_args, eval_cu = inputs(lengths, False, device)
        first = None
        for width, where in [(w, b) for b in opts.boundaries.split(",") for w in widths]:
            use_grouping(width)
            try:
                groups = varlen.length_classes(lengths)
                padded = sum(len(g) * max(lengths[i] for i in g) for g in groups)
                cells = []
                for backward in (False, True):
                    args, cu = inputs(lengths, backward, device)
                    if backward:
                        args = args + [torch.randn(1, opts.total, HQ, D, device=device, dtype=torch.bfloat16)]
                    cells.append(timed(nsa_fn(cu.cpu() if where == "host" else cu, backward), args, device,
                                       opts.budget))
                with torch.no_grad():
                    o, idx = nsa_attention(*eval_args, CONFIG, cu_seqlens=eval_cu, return_block_idx=True)
                if first is None:
                    first = (o.float(), idx)
                err = ((o.float() - first[0]).norm() / first[0].norm()).item()
                same = (idx == first[1]).all(-1).float().mean().item()
                label = LABELS.get(width, f"{width} a octave") + f", boundaries on the {where}"
                print(f"| {label} | {len(groups)} | {padded / sum(lengths):.3f} | {cells[0]:.2f} | {cells[1]:.2f} "
                      f"| {err:.1e} | {same:.5f} |")
            finally:
                use_grouping("default")
        if opts.no_dense:
            continue
        dense = []
        longest = max(lengths)
        for backward in (False, True):
            cu = cu_seqlens_of(lengths).to(device)
            fn, kv_heads = dense_fn(cu, longest, backward)
            like = dict(device=device, dtype=torch.bfloat16, requires_grad=backward)
            q, k, v = (torch.randn(1, opts.total, n, D, **like) for n in (HQ, kv_heads, kv_heads))
            try:
                args = [q, k, v] + ([torch.randn(1, opts.total, HQ, D, device=device, dtype=torch.bfloat16)]
                                    if backward else [])
                dense.append(f"{timed(fn, args, device, opts.budget):.2f}" if fn else "no varlen_attn")
            except Exception as exc:  # report, keep the NSA figures
                dense.append(f"failed: {type(exc).__name__}: {str(exc)[:80]}")
        print(f"\nDense `varlen_attn` (causal; {kv_heads} key/value heads) over the same pack: forward "
              f"{dense[0]} ms, forward+backward {dense[1]} ms.\n", flush=True)


if __name__ == "__main__":
    main()
