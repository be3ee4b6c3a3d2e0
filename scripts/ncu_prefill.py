"""One NSA prefill forward (and backward with ``--backward``) between cudaProfilerStart/Stop, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
        python scripts/ncu_prefill.py --length 16384

bf16, B = 1, 64 query heads, 4 KV heads, head dim 128, paper defaults, every op on its Triton
kernel; warm-up calls (compilation, autotune) happen before profiling starts.
"""

from __future__ import annotations

import argparse

import torch

from nsa import NSAConfig
from nsa.ops import nsa_attention
from ncu_range import profile_once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--backward", action="store_true", help="profile the backward too")
    args = parser.parse_args()
    config, T = NSAConfig(), args.length
    bf = dict(device="cuda", dtype=torch.bfloat16, requires_grad=args.backward)
    q, k, v = torch.randn(1, T, 64, 128, **bf), torch.randn(1, T, 4, 128, **bf), torch.randn(1, T, 4, 128, **bf)
    gates = torch.rand(1, T, 64, 3, **bf)

    def step():
        o = nsa_attention(q, k, v, gates, config, backend="triton")
        if args.backward:
            o.backward(torch.ones_like(o))

    profile_once([step], warmup=2)


if __name__ == "__main__":
    main()
