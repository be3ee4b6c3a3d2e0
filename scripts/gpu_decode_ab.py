"""NSA decode steps of whichever ``nsa`` is on the path: graph-replay medians at a few points,
for A/B runs of two trees in turn (``PYTHONPATH=<tree>/src``; no dense, which neither side changes).

Each point: ``do_bench`` median of a CUDA-graph replay of ``nsa_decode`` (L2 flushed, as the
tables), after one check of the step against the float32 reference (relative error, selected
blocks equal). Prints one markdown row a point, led by ``--name``.

Usage: ``python scripts/gpu_decode_ab.py --name new [--points 1:8192 1:65536 16:65536]``.
"""

from __future__ import annotations

import argparse

import torch

from gpu_decode import check, make_inputs, run_nsa, time_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--points", nargs="+", default=["1:8192", "1:65536", "16:8192", "16:65536", "32:65536"],
                        help="batch:context pairs")
    args = parser.parse_args()
    for point in args.points:
        B, S = (int(x) for x in point.split(":"))
        t = make_inputs(B, S)
        res = check(t)
        us = time_us(lambda: run_nsa(t))
        print(f"| {args.name} | {B} | {S} | {us:.2f} | {res['rel_err']:.2e} | {100 * res['blocks_equal']:.2f}% |", flush=True)
        del t
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
