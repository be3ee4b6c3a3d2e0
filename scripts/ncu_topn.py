"""One launch of the prefill top-n (``nsa.ops._triton.block_topn``) on real block masses, between
cudaProfilerStart/Stop, for Nsight Compute: the 64k forward's last query chunk (8192 queries x 4 KV
heads, rows of 1024 blocks, two warps a row), whose launches take about 0.29 ms each (4 of the 8).

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
from nsa.ops._triton.compressed_fwd import SCORE_BUFFER_BYTES, _score_geometry, query_chunk
from nsa.ops._triton.attention import LOG2E
from nsa.ops.compressed import gluon_pass1, gluon_scores
from ncu_range import compressed_inputs, profile_once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=65536)
    args = parser.parse_args()
    config, q, k_cmp, _, scale = compressed_inputs(args.length)
    B, TQ, HQ, _ = q.shape
    H = k_cmp.shape[2]
    o, lse, lse2 = torch.empty_like(q), torch.empty(B, TQ, HQ, device="cuda"), torch.empty(B, TQ, HQ, device="cuda")
    gluon_pass1.compressed_pass1_gluon(q, k_cmp, k_cmp, o, lse, lse2, 0, scale * LOG2E, config.cmp_block,
                                       config.cmp_stride)
    geo = _score_geometry(config)
    nsel, planes = config.num_sel_blocks(TQ), geo["NSPILL"]
    chunk = query_chunk(B, TQ, H, planes * nsel, 128 // (HQ // H), SCORE_BUFFER_BYTES)
    t0 = (TQ - 1) // chunk * chunk  # the last chunk: its rows are the longest
    sc = torch.empty(B, TQ - t0, H, planes, nsel, device="cuda")
    gluon_scores.compressed_scores_gluon(q, k_cmp, lse2, sc, 0, scale * LOG2E, t0, TQ, nsel,
                                         dict(L=config.cmp_block, S=config.cmp_stride, SEL=config.sel_block,
                                              R=geo["R"], KC=geo["KC"], NSPILL=planes))
    idx = torch.empty(B, TQ, H, config.sel_count, dtype=torch.int32, device="cuda")
    profile_once([lambda: block_topn(sc, idx, t0, t0, config.sel_block, config.init_blocks, config.local_blocks)])
    print(f"top-n of queries {t0}..{TQ - 1}: {B * (TQ - t0) * H} rows of {nsel} blocks")


if __name__ == "__main__":
    main()
