"""``torch.compile`` over a model that holds an ``NSAAttention`` layer: does it run, does it give
eager's results, where does Dynamo break the graph, and what does it cost or gain?

For each case (training: forward and the gradients of the input and every parameter; inference:
a forward under ``no_grad``; decode: prefill into a cache, then one-token steps) the script runs
the layer eagerly and compiled (``torch.compile(layer)``, default mode), compares outputs and
gradients (relative error against eager) and the blocks selected (the share of ``block_idx``
equal, worst call), counts Dynamo's graph breaks by reason, tries
``fullgraph=True`` (which raises at the first break), and times both (``do_bench`` medians).

``--mode reduce-overhead`` compiles with CUDA graphs (Inductor's cudagraph trees): the host's
launches, which bound short sequences (``scripts/gpu_host_cost.py``), are replayed in one; the
table then also counts the calls Inductor ran without its graphs, by reason.

Usage: ``python scripts/gpu_compile.py [--length 4096] [--cases train,infer,decode] [--dtype float32]
[--backend reference] [--mode reduce-overhead]``; prints
markdown. ``--device cpu`` runs a small float64 layer on the reference backend (a smoke test;
inductor needs a C++ compiler there).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import time
import traceback
from typing import Callable, Dict, List

import torch

from nsa import NSAAttention, NSAConfig
from nsa.testing import rel_error


BLOCKS: List[torch.Tensor] = []  # block_idx of every nsa_attention call of the layer, in order


@contextlib.contextmanager
def recording_blocks():
    """Keep the ``block_idx`` of each of the layer's ``nsa_attention`` calls in :data:`BLOCKS`
    while it lasts. The recorder is a graph break (it runs untraced, to see each call), so the
    timings and the ``fullgraph=True`` try run without it."""
    import nsa.modules.attention as attention

    op = attention.nsa_attention

    @torch.compiler.disable
    def recorded(*args, **kwargs):
        o, block_idx = op(*args, **kwargs)
        BLOCKS.append(block_idx)
        return o, block_idx

    attention.nsa_attention = recorded
    try:
        yield
    finally:
        attention.nsa_attention = op


def blocks_equal(run: Callable[[], object]) -> Callable[[], List[torch.Tensor]]:
    def blocks():
        BLOCKS.clear()
        run()
        return list(BLOCKS)

    return blocks


def breaks() -> Dict[str, int]:
    """Dynamo's graph breaks so far, by the first line of their reason."""
    from torch._dynamo.utils import counters

    out: Dict[str, int] = collections.Counter()
    for reason, count in counters["graph_break"].items():
        out[reason.strip().splitlines()[0][:110]] += count
    return dict(out)


SKIPS: List[str] = []  # why Inductor ran a graph without CUDA graphs (mode="reduce-overhead"), in order


def recording_cudagraph_skips() -> None:
    """Keep in :data:`SKIPS` the message of each run that Inductor's cudagraph trees skip (it logs
    them to a logger that is off by default, and counts them without the reason)."""
    import torch._inductor.cudagraph_trees as trees
    import torch._inductor.output_code as output_code

    original = trees.log_cudagraph_skip_and_bump_counter

    def recorded(msg: str) -> None:
        SKIPS.append(msg.strip().splitlines()[0][:110])
        original(msg)

    trees.log_cudagraph_skip_and_bump_counter = output_code.log_cudagraph_skip_and_bump_counter = recorded


def reset() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()


def max_error(got: List[torch.Tensor], want: List[torch.Tensor]) -> float:
    """The largest relative error (norms) of ``got`` against ``want``, tensor by tensor. A tensor
    whose reference is below 1e-9 of the largest one's norm is compared by its difference against
    that norm instead: the gradient of the key compression's last bias is zero up to rounding
    (a shift of every compressed key shifts no softmax), so its relative error is noise."""
    floor = 1e-9 * max(float(w.detach().double().norm()) for w in want)
    out = 0.0
    for g, w in zip(got, want):
        norm = float(w.detach().double().norm())
        out = max(out, rel_error(g, w) if norm > floor else float((g - w).detach().double().norm()) / (floor * 1e9))
    return out


def timed_ms(fn: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=50, return_mode="median")


def case_fns(case: str, layer: NSAAttention, x: torch.Tensor) -> Callable[[NSAAttention], List[torch.Tensor]]:
    """What one case runs on a layer (eager or compiled): its outputs and gradients."""
    if case == "train":
        params = list(layer.parameters())

        def train(model):
            y = model(x)
            return [y, *torch.autograd.grad(y.float().square().mean(), [x, *params])]

        return train
    if case == "infer":
        def infer(model):
            with torch.no_grad():
                return [model(x)]

        return infer
    if case == "decode":
        prompt, steps = x.shape[1] - 4, 4

        def decode(model):
            with torch.no_grad():
                cache = layer.new_cache(batch_size=x.shape[0], capacity=x.shape[1], static=True)
                # copies: under CUDA graphs the next replay of a step reuses its output's memory
                out = [model(x[:, :prompt], cache).clone()]
                for i in range(steps):
                    out.append(model(x[:, prompt + i:prompt + i + 1], cache).clone())
                return out

        return decode
    raise ValueError(f"unknown case {case!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--cases", default="train,infer,decode")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="bfloat16 (GPU default), float32 or float64 (CPU default)")
    parser.add_argument("--backend", default=None, help="the layer's backend: reference or triton (default: routing)")
    parser.add_argument("--mode", default=None, help="torch.compile's mode (default, reduce-overhead, ...)")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    if cuda:
        config, shape, dtype = NSAConfig(), dict(hidden_size=2048, num_heads=64, num_kv_heads=4, head_dim=128), torch.bfloat16
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
              f"triton {__import__('triton').__version__}; bf16, hidden 2048, HQ 64, H 4, D 128, T {args.length}\n")  # fmt: skip
    else:
        config = NSAConfig(cmp_block=8, cmp_stride=4, sel_block=16, sel_count=4, window=32)
        shape, dtype = dict(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16), torch.float64
    dtype = getattr(torch, args.dtype) if args.dtype else dtype
    if args.mode == "reduce-overhead":
        recording_cudagraph_skips()
    layer = NSAAttention(**shape, config=config, backend=args.backend).to(device=device, dtype=dtype)
    print(f"dtype {dtype}, backend {args.backend or 'routing'}, mode {args.mode or 'default'}\n")
    x = torch.randn(1, args.length, shape["hidden_size"], device=device, dtype=dtype, requires_grad=True)
    print("| case | eager ms | compiled ms | first compiled call s | max rel. error vs eager | blocks equal | graph breaks "
          "(+ runs without CUDA graphs) |")
    print("|---|---:|---:|---:|---|---:|---:|")
    details = []
    for case in args.cases.split(","):
        run = case_fns(case, layer, x)
        eager = run(layer)
        reset()
        SKIPS.clear()
        compiled_layer = torch.compile(layer, mode=args.mode)
        try:
            start = time.perf_counter()
            got = run(compiled_layer)
            if cuda:
                torch.cuda.synchronize()
            first = time.perf_counter() - start
            err = max_error(got, eager)
            seen = breaks()
            seen.update({f"ran without CUDA graphs: {why}": n for why, n in collections.Counter(SKIPS).items()})
            t_eager, t_comp = timed_ms(lambda: run(layer), device), timed_ms(lambda: run(compiled_layer), device)
            reset()
            with recording_blocks():
                recorded = torch.compile(layer, mode=args.mode)
                pairs = zip(blocks_equal(lambda: run(recorded))(), blocks_equal(lambda: run(layer))())
                same = [float((a == b).float().mean()) for a, b in pairs]
            shown = f"{100 * min(same):.2f} %" if same else "-"
            print(f"| {case} | {t_eager:.3f} | {t_comp:.3f} | {first:.1f} | {err:.2e} | {shown} | {sum(seen.values())} |",
                  flush=True)  # fmt: skip
            details.append((case, seen))
        except Exception as exc:  # noqa: BLE001 - a case that fails is reported, the others still run
            print(f"| {case} | | | | failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} | | |", flush=True)
            details.append((case, {"traceback": traceback.format_exc(limit=-6)}))
        reset()
        try:
            run(torch.compile(layer, fullgraph=True, mode=args.mode))
            details.append((case + ", fullgraph=True", {"compiled without a break": 1}))
        except Exception as exc:  # noqa: BLE001 - the first break is the finding
            details.append((case + ", fullgraph=True", {f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}": 1}))
    for case, seen in details:
        print(f"\n{case}:")
        for reason, count in sorted(seen.items(), key=lambda item: -item[1] if isinstance(item[1], int) else 0):
            print(f"- {count}x {reason}")


if __name__ == "__main__":
    main()
