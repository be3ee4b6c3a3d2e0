"""A decode step's compressed-token emission through the learnable compression, alone: the
modules (the blocks gathered in one launch, ``MLPCompression`` on them, the tokens stored in
another) against the two launches of :mod:`nsa.ops.decode.mlp_emission` in launch variants.

Each way runs inside a CUDA graph (``triton.testing.do_bench_cudagraph``, us a call, the
median), on a static cache of ``--capacity`` tokens, bf16, the paper's geometry, head dim 128,
the default hidden width (256), 4 KV heads, at batch 1 and 16 (one new token a sequence, at
random last positions). Every variant's tokens are compared with the modules' (the largest
difference relative to the largest token); a launch that does not compile is reported as such.

Usage: ``python scripts/gpu_mlp_emission.py [--capacity 4096] [--variant JSON ...]`` (overrides of
``emit_mlp_tokens``; none given: the list below); prints markdown.
"""

from __future__ import annotations

import argparse
import json
from typing import Dict, List

import torch
import triton.testing

import nsa.ops.decode.mlp_emission as mlp_emission
from nsa import NSACache, NSAConfig
from nsa.modules import MLPCompression

H, D = 4, 128
VARIANTS: List[Dict[str, object]] = [
    {},  # the defaults: the session's first launch (3d17e73)
    {"split_positions": 8}, {"split_positions": 2}, {"hidden_tile": 32}, {"sum_stages": 2},
    {"sum_warps": 8}, {"out_tile": 32},
    # fewer splits, the first launch's loop over positions pipelined
    {"split_positions": 8, "hidden_stages": 3}, {"split_positions": 16, "hidden_stages": 3},
    {"split_positions": 32, "hidden_stages": 3}, {"split_positions": 32, "hidden_stages": 4},
    {"split_positions": 32, "hidden_stages": 3, "hidden_tile": 32},
    {"split_positions": 32, "hidden_stages": 3, "hidden_tile": 16},
    {"split_positions": 16, "hidden_stages": 3, "hidden_tile": 32},
    {"split_positions": 8, "hidden_stages": 3, "hidden_tile": 32},
    {"split_positions": 8, "hidden_tile": 32},
]  # fmt: skip


def setup(batch: int, capacity: int):
    torch.manual_seed(0)
    config = NSAConfig()
    cache = NSACache(config, batch, H, D, capacity=capacity, static=True, device="cuda", dtype=torch.bfloat16)
    for name in cache._buf:
        cache.buffer(name).normal_()
    phis = [MLPCompression(D, config).to("cuda", torch.bfloat16).requires_grad_(False) for _ in range(2)]
    last = torch.randint(config.cmp_block - 1, capacity, (batch,), device="cuda")
    return config, cache, phis, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--variant", action="append", type=json.loads, default=[])
    args = parser.parse_args()
    variants = args.variant or VARIANTS
    batches = (1, 16)
    cases = {b: setup(b, args.capacity) for b in batches}
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; capacity {args.capacity}\n")
    print("| way | " + " | ".join(f"batch {b}, us" for b in batches) + " | largest difference |")
    print("|---|" + "---:|" * len(batches) + "---:|")
    want = {}
    row = []
    for b, (config, cache, phis, last) in cases.items():
        mlp_emission_max, mlp_emission.MAX_ROWS = mlp_emission.MAX_ROWS, 0  # the modules' route
        fn = lambda: cache.emit(last, 1, *phis, backend="triton")  # noqa: E731
        fn()
        want[b] = [cache.buffer(n).clone() for n in ("k_cmp", "v_cmp")]
        row.append(f"{1e3 * triton.testing.do_bench_cudagraph(fn, rep=200, return_mode='median'):.1f}")
        mlp_emission.MAX_ROWS = mlp_emission_max
    print(f"| modules (gather, MLPCompression, store) | {' | '.join(row)} | |")
    for variant in variants:
        row, worst = [], 0.0
        try:
            for b, (config, cache, phis, last) in cases.items():
                weights = [phi.emission_weights(torch.bfloat16) for phi in phis]
                raw = [cache.buffer(n) for n in ("k_cmp_raw", "v_cmp_raw", "k_cmp", "v_cmp")]
                fn = lambda: mlp_emission.emit_mlp_tokens(*raw, last, 1, config, weights, **variant)  # noqa: E731
                for name in ("k_cmp", "v_cmp"):
                    cache.buffer(name).normal_()
                fn()
                slots = torch.div(last + 1 - config.cmp_block, config.cmp_stride, rounding_mode="floor")
                rows = torch.arange(b, device="cuda")
                for got, ref in zip((cache.buffer("k_cmp"), cache.buffer("v_cmp")), want[b]):
                    got, ref = got[rows, slots].float(), ref[rows, slots].float()  # the tokens written
                    worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
                row.append(f"{1e3 * triton.testing.do_bench_cudagraph(fn, rep=200, return_mode='median'):.1f}")
            print(f"| {json.dumps(variant) if variant else 'defaults'} | {' | '.join(row)} | {worst:.1e} |")
        except Exception as err:  # noqa: BLE001 - a variant that does not compile or launch is a result
            print(f"| {json.dumps(variant)} | failed: {type(err).__name__}: {str(err)[:120]} | | |")


if __name__ == "__main__":
    main()
