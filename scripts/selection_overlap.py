"""How many distinct selected blocks tiles of neighbouring queries hold, on random inputs, on the CPU.

The selected forward loads every (query, KV head)'s blocks; a kernel whose program takes ``QT``
neighbouring queries would load the distinct blocks of their lists once. This counts both for
``select_blocks``' own choices (the reference, float32, the paper's defaults, 64 query heads over 4 KV
heads of 128), the forced blocks (the initial one and the local ones, which the window kernels take)
left out, and prints their ratio for each ``QT``. Session 72's counts (docs/perf/prefill.md)::

    PYTHONPATH=src python scripts/selection_overlap.py --length 8192 --tiles 2 4 8 16
"""

from __future__ import annotations

import argparse

import torch

from nsa.config import NSAConfig
from nsa.ops import mean_compress, select_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--tiles", type=int, nargs="+", default=[2, 4, 8, 16], help="queries a tile")
    parser.add_argument("--chunk", type=int, default=1024, help="queries a reference call (its memory)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    T, HQ, H, D = args.length, 64, 4, 128
    config = NSAConfig()
    q, k = torch.randn(1, T, HQ, D), torch.randn(1, T, H, D)
    k_cmp = mean_compress(k, config, backend="reference")
    idx = torch.cat([select_blocks(q[:, s:s + args.chunk], k_cmp, config, q_offset=s, backend="reference")
                     for s in range(0, T, args.chunk)], 1)[0]  # [T, H, n]
    own = (torch.arange(T) // config.sel_block)[:, None, None]
    counted = (idx >= config.init_blocks) & (idx <= own - config.local_blocks)  # listed (not -1), not forced
    entries = int(counted.sum())
    print(f"T={T}: {entries} (query, KV head, block) entries, {entries / (T * H):.2f} a query and KV head")
    for qt in args.tiles:
        distinct = sum(idx[s:s + qt, h][counted[s:s + qt, h]].unique().numel()
                       for h in range(H) for s in range(0, T, qt))
        print(f"T={T}, {qt} queries a tile: {distinct} distinct blocks, {distinct / entries:.3f} of the entries")


if __name__ == "__main__":
    main()
