"""Decode steps with the compressed values in launch 1 or on a stream of their own (``values_apart``),
A/B in one process: each point checked (bitwise equal, and against the float32 reference), then
graph-replay ``do_bench`` medians (L2 flushed) in the order ABBA, twice, and each kernel's CUDA time
(eager, the profiler). Dense SDPA decode at the same points in the same run, for the ratio.

Usage: ``python scripts/gpu_values_apart.py [--points 16:65536 32:65536 ...] [--dense]``.
"""

from __future__ import annotations

import argparse

import torch

from gpu_decode import dense_us, kernel_breakdown, make_inputs, run_nsa, run_reference, time_us
from nsa.testing import rel_error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", nargs="+", default=["16:65536", "32:65536", "64:65536", "16:8192", "16:32768", "1:65536"],
                        help="batch:context pairs")
    parser.add_argument("--dense", action="store_true", help="also time dense SDPA decode at each point")
    parser.add_argument("--launch", default="{}", help="decode_fwd overrides of both sides, JSON")
    args = parser.parse_args()
    import json

    common = json.loads(args.launch)
    print(f"device {torch.cuda.get_device_name()}; torch {torch.__version__}; overrides of both sides {common}")
    print("| batch | context | A: launch 1 (us) | B: values apart (us) | B - A | rel. err B | blocks equal | dense (us) |")
    print("|---|---|---|---|---|---|---|---|")
    for point in args.points:
        B, S = (int(x) for x in point.split(":"))
        torch.manual_seed(0)
        t = make_inputs(B, S)
        sides = {"A": dict(common, values_apart=False), "B": dict(common, values_apart=True)}
        o_a, i_a = run_nsa(t, **sides["A"])
        o_b, i_b = run_nsa(t, **sides["B"])
        same = torch.equal(o_a, o_b) and torch.equal(i_a, i_b)
        ref_o, ref_idx = run_reference(t)
        times = {"A": [], "B": []}
        for order in ("ABBA", "ABBA"):
            for side in order:
                times[side].append(time_us(lambda: run_nsa(t, **sides[side])))
        med = {side: sorted(v)[len(v) // 2] for side, v in times.items()}
        dense = ""
        if args.dense:
            d = dense_us(B, S)
            dense = f"{min(d.values()):.1f} ({min(d, key=d.get)})" if d else "n/a"
        print(f"| {B} | {S} | {med['A']:.2f} ({', '.join(f'{x:.2f}' for x in times['A'])}) | "
              f"{med['B']:.2f} ({', '.join(f'{x:.2f}' for x in times['B'])}) | {med['B'] - med['A']:+.2f} | "
              f"{rel_error(o_b, ref_o):.2e} (bitwise A: {same}) | {100 * float((i_b == ref_idx).float().mean()):.2f}% | {dense} |",
              flush=True)
        for side in "AB":
            print(f"  kernels {side}: {kernel_breakdown(t, **sides[side])}", flush=True)
        del t
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
