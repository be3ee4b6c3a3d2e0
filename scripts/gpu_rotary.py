"""The rotary embedding on the GPU: the Triton kernel (``nsa.ops.apply_rotary``) against the PyTorch
reference, alone and inside an eager ``NSAAttention`` layer (``NSA_BACKEND_ROTARY=reference``
puts the layer back on the reference), with ``do_bench`` medians.

Usage: ``python scripts/gpu_rotary.py [--lengths 4096,16384]``; prints markdown (bf16; alone: the
layer's queries, 64 heads of 128; the layer: hidden 2048, HQ 64, H 4, D 128).
"""

from __future__ import annotations

import argparse
import os

import torch
from triton.testing import do_bench

from nsa import NSAAttention, NSAConfig
from nsa.modules.rotary import RotaryEmbedding
from nsa.ops import apply_rotary
from nsa.testing import rel_error


def ms(fn) -> float:
    return do_bench(fn, warmup=10, rep=100, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="4096,16384")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16\n")
    print("| T | queries: forward triton / reference (ms) | forward+backward | rel. error vs float64, triton / reference |")
    print("|---:|---|---|---|")
    rotary = RotaryEmbedding(128)
    lengths = [int(t) for t in args.lengths.split(",")]
    for T in lengths:
        x = torch.randn(1, T, 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        cos, sin = rotary.tables(torch.arange(T, device="cuda"), torch.bfloat16)
        dy = torch.randn_like(x)
        exact = apply_rotary(x.double(), cos.double(), sin.double(), backend="reference")
        row = {}
        for backend in ("triton", "reference"):
            fwd = ms(lambda: apply_rotary(x, cos, sin, backend=backend))
            both = ms(lambda: torch.autograd.grad(apply_rotary(x, cos, sin, backend=backend), x, dy))
            err = rel_error(apply_rotary(x, cos, sin, backend=backend), exact)
            row[backend] = (fwd, both, err)
        t, r = row["triton"], row["reference"]
        print(f"| {T} | {t[0]:.3f} / {r[0]:.3f} | {t[1]:.3f} / {r[1]:.3f} | {t[2]:.1e} / {r[2]:.1e} |", flush=True)
    print("\n| T | eager layer forward, triton rotary / reference (ms) | forward+backward |")
    print("|---:|---|---|")
    layer = NSAAttention(2048, 64, 4, 128, config=NSAConfig()).cuda().bfloat16()
    for T in lengths:
        x = torch.randn(1, T, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        row = {}
        for backend in ("auto", "reference"):
            os.environ["NSA_BACKEND_ROTARY"] = backend

            def forward():
                with torch.no_grad():
                    layer(x)

            def train():
                torch.autograd.grad(layer(x).float().square().mean(), [x, *layer.parameters()])

            row[backend] = (ms(forward), ms(train))
        os.environ.pop("NSA_BACKEND_ROTARY")
        a, r = row["auto"], row["reference"]
        print(f"| {T} | {a[0]:.3f} / {r[0]:.3f} | {a[1]:.3f} / {r[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
