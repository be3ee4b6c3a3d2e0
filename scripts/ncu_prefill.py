"""One NSA prefill forward (and backward with ``--backward``) between cudaProfilerStart/Stop, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
        python scripts/ncu_prefill.py --length 16384

bf16, B = 1, 64 query heads, 4 KV heads, head dim 128, paper defaults, every op on its Triton
kernel; warm-up calls (compilation, autotune) happen before profiling starts. ``--dense``
profiles dense SDPA (causal, GQA, the cuDNN backend the tables compare with) on the same shapes
instead.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from nsa import NSAConfig
from nsa.ops import nsa_attention
from ncu_range import profile_once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--backward", action="store_true", help="profile the backward too")
    parser.add_argument("--dense", action="store_true", help="dense SDPA (cuDNN) instead of NSA")
    args = parser.parse_args()
    config, T = NSAConfig(), args.length
    bf = dict(device="cuda", dtype=torch.bfloat16, requires_grad=args.backward)
    q, k, v = torch.randn(1, T, 64, 128, **bf), torch.randn(1, T, 4, 128, **bf), torch.randn(1, T, 4, 128, **bf)
    gates = torch.rand(1, T, 64, 3, **bf)

    def attend():
        if not args.dense:
            return nsa_attention(q, k, v, gates, config, backend="triton")
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True).transpose(1, 2)

    def step():
        o = attend()
        if args.backward:
            o.backward(torch.ones_like(o))

    profile_once([step], warmup=2)


if __name__ == "__main__":
    main()
