"""One prefill forward (and backward with ``--backward``) between cudaProfilerStart/Stop, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
        python scripts/ncu_prefill.py --length 16384

The call and its inputs are those that ``nsa.bench prefill`` times (``nsa.bench.workloads``):
bf16, B = 1, 64 query heads, 4 KV heads, head dim 128, paper defaults, NSA on its Triton
kernels; ``--impl dense_cudnn`` (or ``dense``, ``dense_flash``) profiles dense SDPA (causal,
GQA) on the same shapes instead. Warm-up calls (compilation, autotune) happen before profiling
starts.
"""

from __future__ import annotations

import argparse

import torch

from nsa import NSAConfig
from nsa.bench.workloads import DENSE_PREFILL_BACKENDS, Shape, _prefill_fn, prefill_inputs
from ncu_range import profile_once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--backward", action="store_true", help="profile the backward too")
    parser.add_argument("--impl", default="nsa", choices=["nsa", *DENSE_PREFILL_BACKENDS],
                        help="NSA, or dense SDPA with its own backend choice or one forced")
    args = parser.parse_args()
    device = torch.device("cuda")
    inputs = prefill_inputs(args.impl, Shape.default(device, 1, args.length), device, args.backward)
    call = _prefill_fn(args.impl, NSAConfig(), args.backward)
    profile_once([lambda: call(*inputs)], warmup=2)


if __name__ == "__main__":
    main()
