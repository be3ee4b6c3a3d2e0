"""The learnable compression (``MLPCompression``) forward and forward+backward as it is now (blocks
unfolded heads first and copied to one layout, so that ``torch.export`` can trace it for any
length; session 36) against its form before (blocks unfolded in token order, flattened by the
MLP's input), on the same weights: outputs and gradients compared, and ``do_bench`` medians.
(A first form of session 36 gathered the blocks by index: 0.986 against 0.712 ms forward+backward
at 8k on the H200, whose index backward this form does not have.)

Usage: ``python scripts/gpu_compression.py [--lengths 8192,65536]``; prints markdown (bf16, H 4,
D 128, the paper's cmp_block 32 and cmp_stride 16).
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from nsa import NSAConfig
from nsa.modules.compression import MLPCompression
from nsa.testing import rel_error


def unfolded(phi: MLPCompression, x: torch.Tensor) -> torch.Tensor:
    """The forward as it was before session 36: unfolded blocks, flattened per token and head."""
    cfg = phi.config
    blocks = x.unfold(1, cfg.cmp_block, cfg.cmp_stride)[:, : cfg.num_cmp(x.shape[1])]  # [B, N, H, D, l]
    blocks = blocks.permute(0, 1, 2, 4, 3) + phi.pos_emb.to(x.dtype)  # [B, N, H, l, D]
    return phi.mlp(blocks.flatten(-2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="8192,65536")
    args = parser.parse_args()
    torch.manual_seed(0)
    config, H, D = NSAConfig(), 4, 128
    phi = MLPCompression(D, config).cuda().bfloat16()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16, H {H}, D {D}\n")
    print("| T | forward now / before (ms) | forward+backward now / before (ms) | output rel. error | dx rel. error |")
    print("|---:|---|---|---:|---:|")
    for T in (int(t) for t in args.lengths.split(",")):
        x = torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(1, config.num_cmp(T), H, D, device="cuda", dtype=torch.bfloat16)
        runs = {"now": phi, "before": lambda x: unfolded(phi, x)}
        out = {name: fn(x) for name, fn in runs.items()}
        dx = {name: torch.autograd.grad(out[name], x, dy)[0] for name in runs}

        def fwd(fn):
            return lambda: fn(x)

        def fwd_bwd(fn):
            return lambda: torch.autograd.grad(fn(x), [x, *phi.parameters()], dy)

        ms = {name: [do_bench(make(fn), warmup=10, rep=100, return_mode="median") for make in (fwd, fwd_bwd)]
              for name, fn in runs.items()}
        print(f"| {T} | {ms['now'][0]:.3f} / {ms['before'][0]:.3f} | {ms['now'][1]:.3f} / {ms['before'][1]:.3f} | "
              f"{rel_error(out['now'], out['before']):.1e} | {rel_error(dx['now'], dx['before']):.1e} |", flush=True)


if __name__ == "__main__":
    main()
