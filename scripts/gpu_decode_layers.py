"""What one layer's decode step costs inside a captured model step: L layers in one CUDA graph.

The decode tables (``gpu_decode.py``, ``python -m nsa.bench decode``) replay a graph that holds
one layer's step, as the decode issue asks. A model captures all its layers in one graph, so
the replay's fixed cost (its launch, the first kernel's start) is paid once per token, not once
per layer. This script measures that view, for NSA and dense alike:

- ``L`` layers, each with its own caches (bf16, HQ 64, H 4, D 128, paper defaults), so no layer
  finds another's bytes in L2;
- layer ``l + 1``'s query is layer ``l``'s output (same shape), so each layer's first launch
  waits for the layer before, as it would behind the previous layer's projections (the first
  decode launch takes no programmatic dependent launch);
- the whole stack captured in one graph; also one layer alone, in its own graph.

Per layer = stack / L; marginal = (stack - one layer) / (L - 1): what each added layer costs.
Timings are medians of graph replays with the L2 flushed before each replay, two ways
(``gpu_flush_probe.py``): ``zero`` (``triton.testing.do_bench``, the tables' timing) and ``read``
(nothing dirty). Before timing, the graph's last output is compared with the same layers run
eagerly (and eager with eager).

Usage: ``python scripts/gpu_decode_layers.py [--contexts 8192 65536] [--batches 1 16]
[--layers 8] [--reps 300]``; prints markdown. The stacks are one-layer atoms of the model's
step: no projection, normalisation or MLP runs between them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode import dense_inputs, graph_of, make_inputs, run_nsa  # noqa: E402
from gpu_flush_probe import median_us  # noqa: E402


def stack(layer: Callable[[torch.Tensor, object], torch.Tensor], caches: List[object],
          q0: torch.Tensor) -> Callable[[int], torch.Tensor]:
    """``run(n)``: the first ``n`` layers, ``layer(query, cache)`` each, each query the output of
    the layer before (the first ``q0``)."""

    def run(n: int) -> torch.Tensor:
        x = q0
        for cache in caches[:n]:
            x = layer(x, cache)
        return x

    return run


def nsa_stack(B: int, S: int, layers: int) -> Callable[[int], torch.Tensor]:
    """NSA layers (``nsa_decode`` over each layer's own caches), chained by :func:`stack`."""
    caches: List[Dict[str, torch.Tensor]] = [make_inputs(B, S) for _ in range(layers)]
    return stack(lambda x, t: run_nsa(dict(t, q=x))[0], caches, caches[0]["q"])


def dense_stack(B: int, S: int, layers: int) -> Callable[[int], torch.Tensor]:
    """Dense layers (SDPA over each layer's whole cache), chained by :func:`stack`."""
    caches = [dense_inputs(B, S) for _ in range(layers)]
    sdpa = lambda x, kv: F.scaled_dot_product_attention(x, kv[1], kv[2], enable_gqa=True)  # noqa: E731
    return stack(sdpa, caches, caches[0][0])


def measure(run: Callable[[int], torch.Tensor], layers: int, buf: torch.Tensor, reps: int) -> Dict[str, float]:
    """Check the stack's graph against eager layers, then time one layer and the stack."""
    want = run(layers).clone()
    graphs = {n: graph_of(lambda n=n: run(n)) for n in (1, layers)}
    graphs[layers].output.fill_(float("nan"))
    graphs[layers].replay()
    got = graphs[layers].output
    out = {"max_diff": float((got.float() - want.float()).abs().max()), "max_out": float(want.float().abs().max()),
           "eager_again": float(torch.equal(want, run(layers)))}
    for n, graph in graphs.items():
        out[f"zero_{n}"] = 1e3 * triton.testing.do_bench(graph.replay, warmup=50, rep=reps, return_mode="median")
        out[f"read_{n}"] = median_us(graph, "read", buf, reps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args()
    if args.layers < 2:
        parser.error(f"--layers must be at least 2 (the marginal cost needs two stack sizes), got {args.layers}")
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(f"# One layer's decode step inside a graph of {args.layers} layers\n")
    print(f"Device: {props.name} ({props.multi_processor_count} SMs); torch {torch.__version__}, "
          f"triton {triton.__version__}, CUDA {torch.version.cuda}. Medians of graph replays, us.\n")
    print("| B | context | flush | NSA 1 layer | NSA per layer | NSA marginal | dense 1 layer | dense per layer "
          "| dense marginal | dense / NSA, 1 layer | per layer | marginal |")
    print("|---|---|---|" + "---:|" * 9)
    buf = torch.empty(256 * 2**20 // 4, device="cuda", dtype=torch.int32)
    L = args.layers
    checks: List[str] = []
    for S in args.contexts:
        for B in args.batches:
            res = {}
            for name, make in (("nsa", nsa_stack), ("dense", dense_stack)):
                res[name] = measure(make(B, S, L), L, buf, args.reps)
                torch.cuda.empty_cache()
            # the stack's graph against eager layers (and eager against itself): equal, or say so
            checks.append(f"B={B} S={S}: " + ", ".join(
                f"{name} graph - eager max |diff| {r['max_diff']:.1e} (max |o| {r['max_out']:.1e}), eager twice equal {bool(r['eager_again'])}"
                for name, r in res.items()))
            for flush in ("zero", "read"):
                cells = []
                for name in ("nsa", "dense"):
                    one, stack = res[name][f"{flush}_1"], res[name][f"{flush}_{L}"]
                    cells.append((one, stack / L, (stack - one) / (L - 1)))
                ratios = [d / n for n, d in zip(cells[0], cells[1])]
                print(f"| {B} | {S} | {flush} | " + " | ".join(f"{x:.1f}" for c in cells for x in c)
                      + " | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |", flush=True)
    print("\nThe last layer's output, the stack's graph against the same layers run eagerly:\n")
    print("\n".join(f"- {c}" for c in checks))


if __name__ == "__main__":
    main()
