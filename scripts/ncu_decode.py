"""One decode step per case between cudaProfilerStart/Stop, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats python scripts/ncu_decode.py --cases 16:65536 1:65536

Each case runs the default launch (PDL off, so every kernel's time is its own) and, with
``--dense``, dense SDPA decode over the same context; warm-up launches (compilation, autotune)
happen before profiling starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode import dense_inputs, make_inputs, run_nsa  # noqa: E402
from ncu_range import profile_once  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["16:65536", "1:65536"], help="batch:context pairs")
    parser.add_argument("--dense", action="store_true", help="also profile dense SDPA decode")
    parser.add_argument("--launch", default="", help="decode_fwd overrides, e.g. 'cmp_tile=64,cmp_stages=3'")
    args = parser.parse_args()
    launch = {"pdl": False}
    for item in filter(None, args.launch.split(",")):
        name, value = item.split("=")
        launch[name] = int(value) if value.lstrip("-").isdigit() else value == "True"
    steps = []
    for case in args.cases:
        B, S = (int(x) for x in case.split(":"))
        t = make_inputs(B, S)
        steps.append(lambda t=t: run_nsa(t, **launch))
        if args.dense:
            q, K, V = dense_inputs(B, S)
            steps.append(lambda q=q, K=K, V=V: F.scaled_dot_product_attention(q, K, V, enable_gqa=True))
    profile_once(steps, warmup=3)


if __name__ == "__main__":
    main()
