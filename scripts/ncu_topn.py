"""One launch of the prefill top-n (``nsa.ops._triton.block_topn``) on real block masses, between
cudaProfilerStart/Stop, for Nsight Compute: the 64k forward's last query chunk (8192 queries x 4 KV
heads, rows of 1024 blocks), whose launches took about 0.29 ms each (4 of the 8) before session 75
made the top-n read its rows at once, about 0.24 after.

    ncu --profile-from-start off --clock-control none --set full --import-source yes -o /tmp/topn \\
        python scripts/ncu_topn.py
    ncu -i /tmp/topn.ncu-rep --page source --csv --print-source sass > topn_sass.csv

The masses come from the library's own kernels (Gluon pass 1 for the log2-domain lse, then the
Gluon scoring pass for the chunk), as the forward makes them.
"""

from __future__ import annotations

import argparse

import torch

from nsa.ops._triton.block_topn import block_topn
from ncu_range import profile_once, scoring_setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=65536)
    args = parser.parse_args()
    c = scoring_setup(args.length)
    t0 = (c.TQ - 1) // c.chunk * c.chunk  # the last chunk: its rows are the longest
    sc = torch.empty(c.B, c.TQ - t0, c.H, c.planes, c.nsel, device="cuda")
    c.masses(t0, c.TQ, sc)
    idx = torch.empty(c.B, c.TQ, c.H, c.config.sel_count, dtype=torch.int32, device="cuda")
    cfg = c.config
    profile_once([lambda: block_topn(sc, idx, t0, t0, cfg.sel_block, cfg.init_blocks, cfg.local_blocks)])
    print(f"top-n of queries {t0}..{c.TQ - 1}: {c.B * (c.TQ - t0) * c.H} rows of {c.nsel} blocks")


if __name__ == "__main__":
    main()
