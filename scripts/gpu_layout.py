"""The prefill forward by the memory layout of its inputs: are the kernels' K/V reads cheaper
when each head's keys lie contiguous?

NSA's inputs are ``[B, T, heads, D]``: one key of one KV head is 256 contiguous bytes (bf16,
D 128), the next key of that head 1 KiB further (H 4). Every kernel takes strides, so the same
logical tensors can be handed over with another memory order at no change in the results:

- ``token``: ``[B, T, heads, D]`` contiguous (the library's and the benchmark's);
- ``kv_head``: ``k`` and ``v`` stored ``[B, H, T, D]`` (a selected block of 64 keys is then one
  contiguous 16 KiB run instead of 64 runs of 256 bytes), viewed as ``[B, T, H, D]``;
- ``kv_head_copy``: the same, the transposing copy counted in the call (what a model whose
  projection writes ``[B, T, H * D]`` would pay);
- ``all_head``: ``q`` too.

The selected forward is bound by L2 throughput (prefill.md, session 23), and how much of it a
byte costs depends on the access pattern: that is the question. Forward only (``no_grad``; the
training path copies its inputs contiguous). Per layout and length: the forward's median ms
(``nsa.bench.timing``, L2 flushed, calls queued), each kernel's device time from one profiled
call, and whether ``o`` is bitwise the ``token`` layout's (else the largest difference, relative
to ``o``'s largest value).

Usage: ``python scripts/gpu_layout.py [--lengths 8192,16384,65536] [--budget 4]``; prints
markdown. ``--device cpu`` smoke-tests it (interpreter sizes).
"""

from __future__ import annotations

import argparse
import collections
from typing import Callable, Dict, Tuple

import torch

from nsa import NSAConfig
from nsa.bench.timing import Runner, measure_within
from nsa.ops import nsa_attention

HQ, H, D = 64, 4, 128


def head_major(x: torch.Tensor) -> torch.Tensor:
    """``x [B, T, heads, D]`` with the same values, stored ``[B, heads, T, D]``."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


LAYOUTS: Dict[str, Callable[..., Tuple[torch.Tensor, ...]]] = {
    "token": lambda q, k, v: (q, k, v),
    "kv_head": lambda q, k, v: (q, head_major(k), head_major(v)),
    "kv_head_copy": lambda q, k, v: (q, k, v),  # copied inside the call, below
    "all_head": lambda q, k, v: (head_major(q), head_major(k), head_major(v)),
}


def forward(layout: str, config: NSAConfig) -> Callable[..., torch.Tensor]:
    def run(q, k, v, gates):
        with torch.no_grad():
            if layout == "kv_head_copy":
                k, v = head_major(k), head_major(v)
            return nsa_attention(q, k, v, gates, config)

    return run


def kernel_times(fn, args) -> Dict[str, float]:
    """Device ms per kernel name over one call (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    times: Dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type.name == "CUDA":
            times[event.name.split("(")[0][:48]] += event.device_time / 1e3
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="8192,16384,65536")
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--budget", type=float, default=4.0, help="seconds of timing per cell")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    config = NSAConfig()
    dtype = torch.bfloat16 if cuda else torch.float32
    heads = (HQ, H, D) if cuda else (8, 2, 16)
    layouts = args.layouts.split(",")
    if cuda:
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
              f"triton {__import__('triton').__version__}\n")  # fmt: skip
    print("| T | layout | forward ms | o bitwise the token layout's (else max error) |\n|---|---|---:|---|")
    breakdowns = {}
    for T in [int(t) for t in args.lengths.split(",")]:
        torch.manual_seed(0)
        hq, h, d = heads
        q = torch.randn(1, T, hq, d, dtype=dtype, device=device)
        k, v = (torch.randn(1, T, h, d, dtype=dtype, device=device) for _ in range(2))
        gates = torch.rand(1, T, hq, 3, dtype=dtype, device=device)
        first = None
        for layout in layouts:
            inputs = (*LAYOUTS[layout](q, k, v), gates)
            fn = forward(layout, config)
            o = fn(*inputs)
            first = o if first is None else first
            same = "yes" if torch.equal(o, first) else f"no: {((o - first).abs().max() / first.abs().max()).item():.1e}"
            if cuda:
                samples = measure_within(Runner(fn, [inputs], device, queued=True), rounds=40, warmup=3,
                                         budget_s=args.budget)  # fmt: skip
                ms = f"{samples.median * 1e3:.3f}"
                if T in (8192, 65536):
                    breakdowns[(T, layout)] = kernel_times(fn, inputs)
            else:
                ms = "-"
            print(f"| {T} | {layout} | {ms} | {same} |", flush=True)
    for T in sorted({t for t, _ in breakdowns}):
        names = sorted({n for (t, _), b in breakdowns.items() if t == T for n in b},
                       key=lambda n: -breakdowns[(T, layouts[0])].get(n, 0.0))  # fmt: skip
        print(f"\nKernels at T = {T}, device ms of one call:\n")
        print("| kernel | " + " | ".join(layouts) + " |\n|---|" + "---:|" * len(layouts))
        for name in names:
            cells = [f"{breakdowns[(T, lay)].get(name, 0.0):.3f}" for lay in layouts]
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
